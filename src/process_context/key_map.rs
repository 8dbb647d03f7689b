//! `threadlocal.attribute_key_map`: the append-only list that names the
//! `key_index` of record attributes (entry i names key index i). A key
//! keeps its index for the life of the process.

use std::borrow::Cow;

use otel_thread_ctx_abi::process_context::MAX_KEYS;

use super::PublishError;

/// The published key map.
#[derive(Clone, Debug, Default)]
pub struct KeyMap {
    keys: Vec<String>,
}

impl KeyMap {
    pub const fn new() -> Self {
        KeyMap { keys: Vec::new() }
    }

    /// The keys in index order.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The index of every key of `keys`, with the keys not in the map yet
    /// appended in order (a key repeated in `keys` once). Returns the
    /// extended map when a key was added, `None` when all were known; `self`
    /// stays as it is, so that the caller adopts the extension only once it
    /// is published. Fails, adding none of the keys, when the map would
    /// exceed [`MAX_KEYS`].
    pub fn resolve(&self, keys: &[String]) -> Result<(Vec<u32>, Option<KeyMap>), PublishError> {
        let mut key_map = Cow::Borrowed(&self.keys);
        let mut indexes = Vec::with_capacity(keys.len());
        for key in keys {
            let index = match key_map.iter().position(|known| known == key) {
                Some(index) => index,
                None => {
                    if key_map.len() == MAX_KEYS {
                        return Err(PublishError::Range(format!(
                            "the attribute key map holds at most {MAX_KEYS} keys; \"{key}\" would be key number {}",
                            key_map.len() + 1
                        )));
                    }
                    key_map.to_mut().push(key.clone());
                    key_map.len() - 1
                }
            };
            indexes.push(index as u32);
        }
        let extended = match key_map {
            Cow::Owned(keys) => Some(KeyMap { keys }),
            Cow::Borrowed(_) => None,
        };
        Ok((indexes, extended))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn resolve_extends_a_copy_and_leaves_the_map_alone() {
        let map = KeyMap::new();
        let (indexes, extended) = map.resolve(&keys(&["a", "b", "a"])).unwrap();
        assert_eq!(indexes, [0, 1, 0]);
        assert!(map.keys().is_empty(), "the map itself is unchanged");
        let map = extended.expect("new keys extend the map");
        assert_eq!(map.keys(), ["a", "b"]);

        let (indexes, extended) = map.resolve(&keys(&["b", "a"])).unwrap();
        assert_eq!(indexes, [1, 0]);
        assert!(extended.is_none(), "known keys only: no new map");
    }

    #[test]
    fn resolve_refuses_past_the_limit_without_adding_any_key() {
        let all: Vec<String> = (0..MAX_KEYS).map(|i| format!("k{i}")).collect();
        let (_, full) = KeyMap::new().resolve(&all).unwrap();
        let full = full.unwrap();
        assert_eq!(full.len(), MAX_KEYS);
        assert_eq!(full.resolve(&keys(&["k0"])).unwrap().0, [0]);
        let error = full.resolve(&keys(&["k1", "one-too-many"])).unwrap_err();
        assert!(matches!(error, PublishError::Range(_)), "{error:?}");
        assert_eq!(full.len(), MAX_KEYS);
    }
}
