//! The `attrs_data` entries of a record: `{u8 key_index; u8 len; u8 value[len]}`,
//! packed back to back. A key may appear more than once; the last
//! occurrence wins.

use std::fmt;

/// Longest value one entry carries (its length is one byte).
pub const MAX_VALUE_BYTES: usize = u8::MAX as usize;
/// Bytes an entry takes before its value: `key_index` and `len`.
pub const ENTRY_HEADER_SIZE: usize = 2;

/// Key-map name of the span's name, which this writer publishes by default.
pub const SPAN_NAME_KEY: &str = "span.name";
/// Key-map name of the local root span's id (16 lowercase hex digits): the
/// first span of the trace in the process, shared by every span under it.
pub const LOCAL_ROOT_SPAN_ID_KEY: &str = "local_root.span_id";
/// The endpoint attribute (semantic conventions), which every span of a
/// local root's tree publishes by default.
pub const ROUTE_KEY: &str = "http.route";
/// The request method (semantic conventions), published when configured.
pub const METHOD_KEY: &str = "http.request.method";

/// One decoded entry, borrowing its value from the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Index into the process context's attribute key map.
    pub key_index: u8,
    /// The value bytes (UTF-8 as this writer publishes them; readers should
    /// not rely on it).
    pub value: &'a [u8],
}

impl Entry<'_> {
    /// Bytes the entry takes in `attrs_data`.
    pub fn encoded_len(&self) -> usize {
        ENTRY_HEADER_SIZE + self.value.len()
    }
}

/// Why an entry cannot be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The value is longer than [`MAX_VALUE_BYTES`].
    ValueTooLong {
        /// Length of the value given.
        len: usize,
    },
    /// The entry does not fit in the room left in the buffer.
    NoRoom {
        /// Bytes the entry needs.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            EncodeError::ValueTooLong { len } => write!(
                f,
                "an attribute value of {len} bytes is longer than {MAX_VALUE_BYTES} bytes"
            ),
            EncodeError::NoRoom { needed, available } => write!(
                f,
                "an attribute entry of {needed} bytes does not fit in the {available} bytes left"
            ),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Writes `entry` at the start of `out` and returns the bytes written.
/// On error nothing is written.
pub fn encode(entry: Entry<'_>, out: &mut [u8]) -> Result<usize, EncodeError> {
    let len = u8::try_from(entry.value.len()).map_err(|_| EncodeError::ValueTooLong {
        len: entry.value.len(),
    })?;
    let needed = entry.encoded_len();
    let Some(dst) = out.get_mut(..needed) else {
        return Err(EncodeError::NoRoom {
            needed,
            available: out.len(),
        });
    };
    dst[0] = entry.key_index;
    dst[1] = len;
    dst[ENTRY_HEADER_SIZE..].copy_from_slice(entry.value);
    Ok(needed)
}

/// An `attrs_data` buffer ends in the middle of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncated {
    /// Offset of the incomplete entry in the buffer.
    pub offset: usize,
    /// Bytes the entry would need from `offset` (2 when even its `len`
    /// byte is missing).
    pub needed: usize,
    /// Bytes left from `offset`.
    pub available: usize,
}

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "attrs_data ends inside the entry at offset {}: it needs {} bytes, {} are left",
            self.offset, self.needed, self.available
        )
    }
}

impl std::error::Error for Truncated {}

/// The entries of `data`, in order. Yields one `Err(Truncated)` for an
/// incomplete entry at the end, then stops.
pub fn entries(data: &[u8]) -> Entries<'_> {
    Entries { data, offset: 0 }
}

/// Iterator returned by [`entries`].
#[derive(Clone, Debug)]
pub struct Entries<'a> {
    data: &'a [u8],
    offset: usize,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<Entry<'a>, Truncated>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = &self.data[self.offset..];
        if rest.is_empty() {
            return None;
        }
        let needed = match rest {
            [_, len, ..] => ENTRY_HEADER_SIZE + *len as usize,
            _ => ENTRY_HEADER_SIZE,
        };
        if rest.len() < needed {
            let error = Truncated {
                offset: self.offset,
                needed,
                available: rest.len(),
            };
            self.offset = self.data.len();
            return Some(Err(error));
        }
        self.offset += needed;
        Some(Ok(Entry {
            key_index: rest[0],
            value: &rest[ENTRY_HEADER_SIZE..needed],
        }))
    }
}

impl std::iter::FusedIterator for Entries<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ATTRS_CAPACITY;

    #[test]
    fn round_trip() {
        let long = [b'v'; MAX_VALUE_BYTES];
        let written = [
            Entry {
                key_index: 0,
                value: b"GET /users/:id",
            },
            Entry {
                key_index: 7,
                value: b"",
            },
            Entry {
                key_index: 255,
                value: &long,
            },
        ];
        let mut buf = [0u8; ATTRS_CAPACITY];
        let mut used = 0;
        for entry in written {
            used += encode(entry, &mut buf[used..]).unwrap();
        }
        assert_eq!(used, written.iter().map(Entry::encoded_len).sum::<usize>());
        let read: Vec<Entry> = entries(&buf[..used]).collect::<Result<_, _>>().unwrap();
        assert_eq!(read, written);
    }

    #[test]
    fn encode_refuses_what_does_not_fit() {
        let mut buf = [0xaa; 4];
        let too_long = [0u8; MAX_VALUE_BYTES + 1];
        assert_eq!(
            encode(
                Entry {
                    key_index: 1,
                    value: &too_long
                },
                &mut [0; 512]
            ),
            Err(EncodeError::ValueTooLong { len: 256 })
        );
        assert_eq!(
            encode(
                Entry {
                    key_index: 1,
                    value: b"abc"
                },
                &mut buf
            ),
            Err(EncodeError::NoRoom {
                needed: 5,
                available: 4
            })
        );
        assert_eq!(buf, [0xaa; 4], "nothing written on error");
        assert_eq!(
            encode(
                Entry {
                    key_index: 1,
                    value: b"ab"
                },
                &mut buf
            ),
            Ok(4)
        );
        assert_eq!(buf, [1, 2, b'a', b'b']);
    }

    #[test]
    fn truncated_input_is_an_error_after_the_complete_entries() {
        let mut it = entries(&[3, 1, b'x', 4, 5, b'a', b'b']);
        assert_eq!(
            it.next(),
            Some(Ok(Entry {
                key_index: 3,
                value: b"x"
            }))
        );
        assert_eq!(
            it.next(),
            Some(Err(Truncated {
                offset: 3,
                needed: 7,
                available: 4
            }))
        );
        assert_eq!(it.next(), None);
        assert_eq!(it.next(), None);
    }

    #[test]
    fn a_lone_key_byte_is_truncated_and_empty_input_has_no_entries() {
        assert_eq!(
            entries(&[9]).collect::<Vec<_>>(),
            vec![Err(Truncated {
                offset: 0,
                needed: 2,
                available: 1
            })]
        );
        assert_eq!(entries(&[]).count(), 0);
        assert_eq!(
            entries(&[9, 0]).collect::<Vec<_>>(),
            vec![Ok(Entry {
                key_index: 9,
                value: b""
            })]
        );
        assert!(Truncated {
            offset: 0,
            needed: 2,
            available: 1
        }
        .to_string()
        .contains("offset 0"));
    }
}
