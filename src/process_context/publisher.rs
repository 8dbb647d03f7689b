//! The process-wide writer: builds each payload, publishes it through the
//! header protocol, names the mapping, and keeps superseded payloads
//! allocated for a grace period.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use prost::Message;

use super::header::{boottime_ns, first_publication_steps, update_steps};
use super::key_map::KeyMap;
use super::mapping::{Backing, Mapping};
use super::payload::{self, Contents, KeyValue};
use super::{Info, PublishError};
use otel_thread_ctx_abi::node_schema::V8Layout;
use otel_thread_ctx_abi::process_context::{DEFAULT_SCHEMA_VERSION, MAX_PAYLOAD_BYTES};

/// How long a superseded payload stays allocated after the update that
/// replaced it (see [`Publisher::retire`]).
const RETAIN_NS: u64 = 10_000_000_000;
/// Bytes of superseded payloads kept inside the grace period at most.
const RETAINED_BYTES_MAX: usize = 16 << 20;

/// A payload replaced by a newer publication, kept allocated for a while.
struct Retired {
    bytes: Box<[u8]>,
    since_ns: u64,
}

/// The process-wide writer state. Only the holder of [`PUBLISHER`]'s lock
/// writes the header.
pub struct Publisher {
    mapping: Option<Mapping>,
    resource: Vec<KeyValue>,
    attributes: Vec<KeyValue>,
    schema_version: Cow<'static, str>,
    key_map: KeyMap,
    /// The payload the header points at now.
    current: Option<Box<[u8]>>,
    retired: VecDeque<Retired>,
    retired_bytes: usize,
    published_at_ns: u64,
    publications: u64,
    /// Threads publishing in frame mode, and the layout they publish with.
    frame_threads: usize,
    frame_layout: Option<V8Layout>,
}

static PUBLISHER: Mutex<Publisher> = Mutex::new(Publisher::new());

pub fn lock() -> MutexGuard<'static, Publisher> {
    // The header is consistent between any two statements that can panic
    // (none run while an update is half done), so a poisoned lock is safe to
    // reuse.
    PUBLISHER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Publisher {
    const fn new() -> Self {
        Publisher {
            mapping: None,
            resource: Vec::new(),
            attributes: Vec::new(),
            schema_version: Cow::Borrowed(DEFAULT_SCHEMA_VERSION),
            key_map: KeyMap::new(),
            current: None,
            retired: VecDeque::new(),
            retired_bytes: 0,
            published_at_ns: 0,
            publications: 0,
            frame_threads: 0,
            frame_layout: None,
        }
    }

    /// Forgets a mapping inherited through `fork()`: the child does not have
    /// it (`MADV_DONTFORK`), so writing to it would fault. The payloads are
    /// the parent's copies and are freed like any heap memory.
    pub fn forget_if_forked(&mut self) {
        if self.mapping.as_ref().is_some_and(Mapping::is_inherited) {
            self.mapping = None;
            self.current = None;
            self.retired.clear();
            self.retired_bytes = 0;
        }
    }

    /// Publishes a payload built from the given contents and, only when
    /// that succeeded, makes them the publisher's state.
    pub fn publish(
        &mut self,
        resource: Option<Vec<KeyValue>>,
        attributes: Option<Vec<KeyValue>>,
        schema_version: Option<String>,
        key_map: Option<KeyMap>,
    ) -> Result<(), PublishError> {
        self.forget_if_forked();
        let contents = Contents {
            resource: resource.as_deref().unwrap_or(&self.resource),
            attributes: attributes.as_deref().unwrap_or(&self.attributes),
            schema_version: schema_version.as_deref().unwrap_or(&self.schema_version),
            key_map: key_map.as_ref().unwrap_or(&self.key_map).keys(),
            frame_layout: self.frame_layout,
        };
        let bytes = payload::encode(&contents);
        if bytes.len() > MAX_PAYLOAD_BYTES {
            return Err(PublishError::Range(oversize_message(
                bytes.len(),
                &contents,
            )));
        }
        let bytes = bytes.into_boxed_slice();

        let created = match self.mapping {
            Some(_) => None,
            None => Some(
                Mapping::create()
                    .map_err(|e| PublishError::Os(format!("cannot map the OTEL_CTX page: {e}")))?,
            ),
        };
        let mapping = created
            .as_ref()
            .or(self.mapping.as_ref())
            .expect("a mapping exists");
        let header = mapping.header();
        let published_at = boottime_ns().max(self.published_at_ns + 1);
        let size = bytes.len() as u32;
        let address = bytes.as_ptr() as u64;

        header.apply(&if self.current.is_none() {
            first_publication_steps(size, address, published_at)
        } else {
            update_steps(size, address, published_at)
        });

        // Naming last: a reader that finds the mapping by name finds it
        // complete. Without memfd the name is the only way to find it.
        let named = mapping.name();
        if let Some(created) = created {
            if created.backing() == Backing::Anonymous && !named {
                // SAFETY: never named, so no reader could locate it; no
                // payload pointer escapes (this publication is abandoned).
                unsafe { created.discard() };
                return Err(PublishError::Os(
                    "cannot publish the process context: memfd_create is unavailable and the kernel \
                     refused to name an anonymous mapping (PR_SET_VMA_ANON_NAME needs Linux 5.17+ with \
                     CONFIG_ANON_VMA_NAME)"
                        .into(),
                ));
            }
            self.mapping = Some(created);
        }

        if let Some(previous) = self.current.replace(bytes) {
            self.retire(previous, published_at);
        }
        if let Some(resource) = resource {
            self.resource = resource;
        }
        if let Some(attributes) = attributes {
            self.attributes = attributes;
        }
        if let Some(schema_version) = schema_version {
            self.schema_version = Cow::Owned(schema_version);
        }
        if let Some(key_map) = key_map {
            self.key_map = key_map;
        }
        self.published_at_ns = published_at;
        self.publications += 1;
        Ok(())
    }

    /// Keeps a superseded payload allocated for a grace period.
    ///
    /// A reader that read the old pointer just before an update may still
    /// be copying the old bytes. Its copy is discarded by protocol (the
    /// timestamp it re-reads has changed), so freeing early would not make
    /// it accept garbage; keeping the bytes intact and mapped is defence in
    /// depth for readers that stop on read errors or validate the payload
    /// before the timestamp. Bounds: a payload superseded for longer than
    /// [`RETAIN_NS`] is freed at the next publication, and the newest
    /// superseded payloads are kept only up to [`RETAINED_BYTES_MAX`] bytes
    /// (older ones are freed first), so memory stays bounded however often
    /// a caller republishes.
    fn retire(&mut self, bytes: Box<[u8]>, now_ns: u64) {
        self.retired_bytes += bytes.len();
        self.retired.push_back(Retired {
            bytes,
            since_ns: now_ns,
        });
        while let Some(oldest) = self.retired.front() {
            let expired = now_ns.saturating_sub(oldest.since_ns) > RETAIN_NS;
            if !expired && self.retired_bytes <= RETAINED_BYTES_MAX {
                break;
            }
            self.retired_bytes -= oldest.bytes.len();
            self.retired.pop_front();
        }
    }

    /// Appends the keys not yet in the key map; returns every key's index.
    /// Republishes only if a key was added.
    pub fn register_keys(&mut self, keys: &[String]) -> Result<Vec<u32>, PublishError> {
        let (indexes, extended) = self.key_map.resolve(keys)?;
        if let Some(key_map) = extended {
            self.publish(None, None, None, Some(key_map))?;
        }
        Ok(indexes)
    }

    /// Counts a thread starting (`joining`) or stopping frame-mode
    /// publication. While any thread publishes in frame mode the context
    /// announces the Node.js schema with `layout`; republishes only when
    /// that changes. On error the count and the context are unchanged.
    pub fn frame_thread(&mut self, joining: bool, layout: V8Layout) -> Result<(), PublishError> {
        let count = if joining {
            self.frame_threads + 1
        } else {
            self.frame_threads.saturating_sub(1)
        };
        let next = (count > 0).then_some(layout);
        let previous = std::mem::replace(&mut self.frame_layout, next);
        if previous != next {
            if let Err(error) = self.publish(None, None, None, None) {
                self.frame_layout = previous;
                return Err(error);
            }
        }
        self.frame_threads = count;
        Ok(())
    }

    pub fn info(&self) -> Option<Info> {
        let mapping = self.mapping.as_ref()?;
        let current = self.current.as_ref()?;
        Some(Info {
            mapping_address: mapping.address(),
            mapping_len: mapping.len(),
            backing: mapping.backing(),
            published_at_ns: self.published_at_ns,
            payload_address: current.as_ptr() as usize,
            payload_size: current.len(),
            key_count: self.key_map.len(),
            resource_attribute_count: self.resource.len(),
            publications: self.publications,
            retained_payloads: self.retired.len(),
        })
    }
}

/// Why a payload of `size` bytes is refused, and what to trim: the largest
/// part of it, so that the caller knows where the bytes went.
fn oversize_message(size: usize, contents: &Contents<'_>) -> String {
    let parts = contents
        .resource
        .iter()
        .map(|kv| {
            (
                format!("the Resource attribute \"{}\"", kv.key),
                kv.encoded_len(),
            )
        })
        .chain(
            contents
                .attributes
                .iter()
                .map(|kv| (format!("the attribute \"{}\"", kv.key), kv.encoded_len())),
        )
        .chain(std::iter::once((
            format!("the attribute key map ({} keys)", contents.key_map.len()),
            payload::key_map_value(contents.key_map).encoded_len(),
        )));
    let (largest, largest_size) = parts
        .max_by_key(|(_, size)| *size)
        .expect("the key map is always a part");
    format!(
        "the process context payload would be {size} bytes, over the {MAX_PAYLOAD_BYTES} bytes profilers accept \
         (the OpenTelemetry eBPF profiler rejects a larger one whole); trim it by {} bytes: \
         the largest part is {largest} ({largest_size} bytes)",
        size - MAX_PAYLOAD_BYTES
    )
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use otel_thread_ctx_abi::process_context::{
        HEADER_SIZE, KEY_MAP_KEY, MAX_KEYS, OFFSET_PAYLOAD, OFFSET_PAYLOAD_SIZE,
        OFFSET_PUBLISHED_AT, OFFSET_SIGNATURE, OFFSET_VERSION,
    };

    use super::super::payload::{any_value, AnyValue, ProcessContext};
    use super::*;

    /// Reads the published context the way an outside reader does, from
    /// the header fields (one attempt; tests run without concurrent writers).
    fn read(publisher: &Publisher) -> (u64, ProcessContext) {
        let header = publisher.mapping.as_ref().unwrap().header();
        let (published_at, size, address) = header.published();
        assert_ne!(published_at, 0);
        let (size, address) = (size as usize, address as usize as *const u8);
        // SAFETY: the payload the header points at is owned by `publisher.current`.
        let bytes = unsafe { std::slice::from_raw_parts(address, size) };
        (published_at, ProcessContext::decode(bytes).unwrap())
    }

    fn key_map(context: &ProcessContext) -> Vec<String> {
        let entry = context
            .attributes
            .iter()
            .find(|kv| kv.key == KEY_MAP_KEY)
            .unwrap();
        match entry.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::ArrayValue(array)) => array
                .values
                .iter()
                .map(|v| match &v.value {
                    Some(any_value::Value::StringValue(s)) => s.clone(),
                    other => panic!("key map entry is not a string: {other:?}"),
                })
                .collect(),
            other => panic!("key map is not an array: {other:?}"),
        }
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn header_is_written_as_specified_and_payload_decodes() {
        let mut publisher = Publisher::new();
        let resource = vec![KeyValue::new("service.name", AnyValue::string("svc"))];
        publisher
            .publish(Some(resource.clone()), None, None, None)
            .unwrap();
        let mapping = publisher.mapping.as_ref().unwrap();
        // SAFETY: sysconf has no preconditions.
        assert_eq!(mapping.len(), unsafe { libc::sysconf(libc::_SC_PAGESIZE) }
            as usize);
        // SAFETY: the header page is mapped and HEADER_SIZE bytes long at least.
        let raw =
            unsafe { std::slice::from_raw_parts(mapping.address() as *const u8, HEADER_SIZE) };
        assert_eq!(&raw[OFFSET_SIGNATURE..OFFSET_SIGNATURE + 8], b"OTEL_CTX");
        assert_eq!(
            u32::from_le_bytes(raw[OFFSET_VERSION..OFFSET_VERSION + 4].try_into().unwrap()),
            2
        );
        let current = publisher.current.as_ref().unwrap();
        assert_eq!(
            u32::from_le_bytes(
                raw[OFFSET_PAYLOAD_SIZE..OFFSET_PAYLOAD_SIZE + 4]
                    .try_into()
                    .unwrap()
            ) as usize,
            current.len()
        );
        assert_eq!(
            u64::from_le_bytes(raw[OFFSET_PAYLOAD..OFFSET_PAYLOAD + 8].try_into().unwrap()),
            current.as_ptr() as u64
        );
        let published_at = u64::from_le_bytes(
            raw[OFFSET_PUBLISHED_AT..OFFSET_PUBLISHED_AT + 8]
                .try_into()
                .unwrap(),
        );
        assert!(published_at > 0 && published_at <= boottime_ns());

        let (_, context) = read(&publisher);
        assert_eq!(context.resource.unwrap().attributes, resource);
        assert_eq!(
            context.attributes[0].value,
            Some(AnyValue::string(DEFAULT_SCHEMA_VERSION))
        );
        assert!(key_map(&ProcessContext::decode(&current[..]).unwrap()).is_empty());
    }

    #[test]
    fn updates_keep_omitted_parts_and_strictly_increase_the_timestamp() {
        let mut publisher = Publisher::new();
        let resource = vec![KeyValue::new("service.name", AnyValue::string("svc"))];
        publisher
            .publish(Some(resource.clone()), None, Some("tls_v1".into()), None)
            .unwrap();
        let address = publisher.info().unwrap().mapping_address;
        let (first, _) = read(&publisher);
        let extra = vec![KeyValue::new("custom", AnyValue::int(7))];
        publisher
            .publish(None, Some(extra.clone()), None, None)
            .unwrap();
        let (second, context) = read(&publisher);
        assert!(second > first);
        assert_eq!(
            publisher.info().unwrap().mapping_address,
            address,
            "one mapping per process"
        );
        assert_eq!(context.resource.unwrap().attributes, resource);
        assert_eq!(
            context.attributes[0].value,
            Some(AnyValue::string("tls_v1"))
        );
        assert_eq!(context.attributes[2], extra[0]);
        assert_eq!(publisher.retired.len(), 1, "the superseded payload is kept");
    }

    #[test]
    fn key_map_is_append_only_deduplicated_and_capped() {
        let mut publisher = Publisher::new();
        assert_eq!(
            publisher.register_keys(&keys(&["a", "b", "a"])).unwrap(),
            [0, 1, 0]
        );
        let publications = publisher.publications;
        assert_eq!(publisher.register_keys(&keys(&["b", "a"])).unwrap(), [1, 0]);
        assert_eq!(
            publisher.publications, publications,
            "no new key, no republication"
        );
        assert_eq!(publisher.register_keys(&keys(&["c"])).unwrap(), [2]);
        assert_eq!(key_map(&read(&publisher).1), ["a", "b", "c"]);

        let many: Vec<String> = (3..MAX_KEYS).map(|i| format!("k{i}")).collect();
        let indexes = publisher.register_keys(&many).unwrap();
        assert_eq!(indexes.first(), Some(&3));
        assert_eq!(indexes.last(), Some(&(MAX_KEYS as u32 - 1)));
        let before = read(&publisher);
        // Full: a known key still resolves, a new one fails and changes nothing,
        // even when it comes after known keys in the same call.
        assert_eq!(publisher.register_keys(&keys(&["c"])).unwrap(), [2]);
        let error = publisher
            .register_keys(&keys(&["a", "one-too-many"]))
            .unwrap_err();
        assert!(matches!(error, PublishError::Range(_)), "{error:?}");
        assert_eq!(publisher.key_map.len(), MAX_KEYS);
        let after = read(&publisher);
        assert_eq!(before.0, after.0, "nothing was republished");
        let published = key_map(&after.1);
        assert_eq!(published.len(), MAX_KEYS);
        assert_eq!(&published[..3], ["a", "b", "c"]);
        assert_eq!(published[MAX_KEYS - 1], format!("k{}", MAX_KEYS - 1));
    }

    #[test]
    fn oversized_payload_is_refused_without_change() {
        let mut publisher = Publisher::new();
        publisher.publish(None, None, None, None).unwrap();
        let before = read(&publisher);
        let huge = vec![KeyValue::new(
            "blob",
            AnyValue::string("x".repeat(MAX_PAYLOAD_BYTES)),
        )];
        let error = publisher.publish(Some(huge), None, None, None).unwrap_err();
        let PublishError::Range(message) = &error else {
            panic!("{error:?}")
        };
        assert!(
            message.contains("the Resource attribute \"blob\""),
            "names what to trim: {message}"
        );
        assert_eq!(read(&publisher), before);
        assert!(publisher.resource.is_empty());
    }

    #[test]
    fn superseded_payloads_are_retained_within_bounds() {
        let mut publisher = Publisher::new();
        publisher.publish(None, None, None, None).unwrap();
        let first_payload = publisher.current.as_ref().unwrap().as_ptr();
        let big = |n: usize| vec![KeyValue::new("blob", AnyValue::string("y".repeat(n)))];
        publisher
            .publish(Some(big(1000)), None, None, None)
            .unwrap();
        assert_eq!(
            publisher.retired.front().unwrap().bytes.as_ptr(),
            first_payload,
            "kept, not freed"
        );

        // Past the byte budget the oldest go first; the newest is always kept.
        let blob = MAX_PAYLOAD_BYTES - 1024;
        let publications = RETAINED_BYTES_MAX / blob + 8;
        for _ in 0..publications {
            publisher
                .publish(Some(big(blob)), None, None, None)
                .unwrap();
        }
        assert!(publisher.retired_bytes <= RETAINED_BYTES_MAX);
        assert!(
            publisher.retired.len() < publications,
            "the oldest were freed"
        );
        assert_eq!(
            publisher.retired_bytes,
            publisher
                .retired
                .iter()
                .map(|r| r.bytes.len())
                .sum::<usize>()
        );
        assert!(!publisher.retired.is_empty());

        // Past the grace period everything superseded is freed at the next
        // publication.
        let later = publisher.published_at_ns + RETAIN_NS + 1;
        publisher.retire(vec![0u8; 1].into_boxed_slice(), later + 1);
        assert_eq!(publisher.retired.len(), 1);
    }
}
