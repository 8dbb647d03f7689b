//! Reads V8 heap objects of a live process from the outside: tagged words,
//! an object's instance type through its map, and strings.
//!
//! The target runs on while it is read, and a garbage collection may move
//! or free any object between two reads: every object is type-checked
//! through its map before a field of it is used, every length is bounded,
//! and anything unexpected is an error, never a guess or a panic.

use std::collections::HashMap;

use otel_thread_ctx_abi::node_schema::{smi_value, untag};
use otel_thread_ctx_reader::memory::{Memory, MemoryError};

use super::metadata::Metadata;

/// Longest string read (in UTF-16 code units) for a name or a URL.
pub const MAX_NAME_UNITS: u64 = 4096;

/// Cons strings nest; a chain deeper than this is not followed.
const MAX_STRING_DEPTH: u32 = 32;

/// Bytes read from the target at once when a string is walked.
const CHUNK_BYTES: u64 = 16 * 1024;

/// Most maps whose instance type is remembered; the cache is emptied past
/// it (maps are few: a hundred or so per isolate for what is read here).
const MAX_CACHED_MAPS: usize = 4096;

/// Linux never maps a process's first page: a "pointer" into it (a Smi or
/// a small integer that has the tag bit) is refused without a read.
const NULL_PAGE: u64 = 4096;

/// Why an object could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeapError {
    #[error("{0}")]
    Unreadable(#[from] MemoryError),
    #[error("{what}: {word:#x} is not a heap object")]
    NotAnObject { what: &'static str, word: u64 },
    #[error("{what}: instance type {found} is not the expected one")]
    WrongType { what: &'static str, found: u16 },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

fn invalid(what: &'static str, detail: impl Into<String>) -> HeapError {
    HeapError::Invalid {
        what,
        detail: detail.into(),
    }
}

/// A heap object: its untagged address and its instance type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Object {
    pub address: u64,
    pub instance_type: u16,
}

/// Reads one process's heap with one binary's layout.
pub struct Heap<'m> {
    pub memory: &'m dyn Memory,
    pub meta: &'m Metadata,
    /// Map address -> instance type, for maps already checked.
    map_types: &'m mut HashMap<u64, u16>,
}

impl<'m> Heap<'m> {
    pub fn new(
        memory: &'m dyn Memory,
        meta: &'m Metadata,
        map_types: &'m mut HashMap<u64, u16>,
    ) -> Heap<'m> {
        Heap {
            memory,
            meta,
            map_types,
        }
    }

    pub fn word(&self, address: u64) -> Result<u64, HeapError> {
        Ok(self.memory.read_u64(address)?)
    }

    /// The word at `offset` from the untagged address of `object`.
    pub fn field(&self, object: Object, offset: u64) -> Result<u64, HeapError> {
        let at = object
            .address
            .checked_add(offset)
            .ok_or_else(|| invalid("field", "address out of range"))?;
        self.word(at)
    }

    /// The instance type of the map at `map` (untagged), after checking
    /// that the map's own map is the meta map.
    fn map_instance_type(&mut self, map: u64) -> Result<u16, HeapError> {
        if let Some(&t) = self.map_types.get(&map) {
            return Ok(t);
        }
        let meta_map = self.word(map + self.meta.heap_object_map)?;
        let meta_map = untag(meta_map).ok_or(HeapError::NotAnObject {
            what: "the map's map",
            word: meta_map,
        })?;
        // The meta map is its own map.
        let meta_type = self.read_u16(meta_map + self.meta.map_instance_type)?;
        if meta_type != self.meta.map_type {
            return Err(HeapError::WrongType {
                what: "the map's map",
                found: meta_type,
            });
        }
        let t = self.read_u16(map + self.meta.map_instance_type)?;
        if self.map_types.len() >= MAX_CACHED_MAPS {
            self.map_types.clear();
        }
        self.map_types.insert(map, t);
        Ok(t)
    }

    /// The instance type a map (tagged) gives its objects.
    pub fn map_type(&mut self, map: u64) -> Result<u16, HeapError> {
        let map = untag(map).ok_or(HeapError::NotAnObject {
            what: "map",
            word: map,
        })?;
        self.map_instance_type(map)
    }

    fn read_u16(&self, address: u64) -> Result<u16, HeapError> {
        let mut b = [0u8; 2];
        self.memory.read(address, &mut b)?;
        Ok(u16::from_ne_bytes(b))
    }

    /// The object a tagged word points to.
    pub fn object(&mut self, what: &'static str, tagged: u64) -> Result<Object, HeapError> {
        let address = untag(tagged)
            .filter(|&a| a >= NULL_PAGE)
            .ok_or(HeapError::NotAnObject { what, word: tagged })?;
        let map = self.word(address + self.meta.heap_object_map)?;
        let map = untag(map).ok_or(HeapError::NotAnObject { what, word: map })?;
        Ok(Object {
            address,
            instance_type: self.map_instance_type(map)?,
        })
    }

    /// The object a tagged word points to, when its type is in `types`.
    pub fn typed(
        &mut self,
        what: &'static str,
        tagged: u64,
        types: (u16, u16),
    ) -> Result<Object, HeapError> {
        let o = self.object(what, tagged)?;
        if (types.0..=types.1).contains(&o.instance_type) {
            Ok(o)
        } else {
            Err(HeapError::WrongType {
                what,
                found: o.instance_type,
            })
        }
    }

    pub fn is_string(&self, o: Object) -> bool {
        o.instance_type < self.meta.string_tags.first_nonstring_type
    }

    /// A Smi field.
    pub fn smi_field(
        &self,
        what: &'static str,
        object: Object,
        offset: u64,
    ) -> Result<i64, HeapError> {
        let w = self.field(object, offset)?;
        smi_value(w).ok_or_else(|| invalid(what, format!("{w:#x} is not a Smi")))
    }

    /// A string's length in UTF-16 code units.
    pub fn string_length(&self, s: Object) -> Result<u64, HeapError> {
        let mut b = [0u8; 4];
        self.memory
            .read(s.address + self.meta.string_fields.length, &mut b)?;
        let n = i32::from_ne_bytes(b);
        u64::try_from(n).map_err(|_| invalid("string", format!("length {n}")))
    }

    /// The string `tagged` points to, when it is at most `max_units` long.
    pub fn string(&mut self, tagged: u64, max_units: u64) -> Result<String, HeapError> {
        let s = self.object("string", tagged)?;
        if !self.is_string(s) {
            return Err(HeapError::WrongType {
                what: "string",
                found: s.instance_type,
            });
        }
        let len = self.string_length(s)?;
        if len > max_units {
            return Err(invalid("string", format!("{len} units, past {max_units}")));
        }
        let mut units = Vec::with_capacity(len as usize);
        self.visit(s, 0, len, 0, &mut |chunk| units.extend_from_slice(chunk))?;
        Ok(String::from_utf16_lossy(&units))
    }

    /// Hands `f` the code units `[start, start + len)` of string `s`, in
    /// order, in chunks.
    pub fn visit(
        &mut self,
        s: Object,
        start: u64,
        len: u64,
        depth: u32,
        f: &mut dyn FnMut(&[u16]),
    ) -> Result<(), HeapError> {
        if len == 0 {
            return Ok(());
        }
        if depth > MAX_STRING_DEPTH {
            return Err(invalid("string", "nested too deep"));
        }
        let total = self.string_length(s)?;
        if start.checked_add(len).is_none_or(|end| end > total) {
            return Err(invalid("string", "range past its end"));
        }
        let tags = self.meta.string_tags;
        let fields = self.meta.string_fields;
        let representation = s.instance_type & tags.representation_mask;
        let one_byte = s.instance_type & tags.encoding_mask == tags.one_byte;
        if representation == tags.seq {
            let (chars, width) = if one_byte {
                (fields.seq_one_byte_chars, 1)
            } else {
                (fields.seq_two_byte_chars, 2)
            };
            let mut done = 0;
            let mut bytes = Vec::new();
            let mut units = Vec::new();
            while done < len {
                let n = (len - done).min(CHUNK_BYTES / width);
                bytes.resize((n * width) as usize, 0);
                self.memory
                    .read(s.address + chars + (start + done) * width, &mut bytes)?;
                units.clear();
                if one_byte {
                    units.extend(bytes.iter().map(|&b| u16::from(b)));
                } else {
                    units.extend(
                        bytes
                            .chunks_exact(2)
                            .map(|p| u16::from_ne_bytes([p[0], p[1]])),
                    );
                }
                f(&units);
                done += n;
            }
            Ok(())
        } else if representation == tags.cons {
            let first = self.field(s, fields.cons_first)?;
            let first = self.string_object(first)?;
            let first_len = self.string_length(first)?;
            if first_len > total {
                return Err(invalid("cons string", "its first part is longer than it"));
            }
            if start < first_len {
                let n = len.min(first_len - start);
                self.visit(first, start, n, depth + 1, f)?;
            }
            let end = start + len;
            if end > first_len {
                let second = self.field(s, fields.cons_second)?;
                let second = self.string_object(second)?;
                let from = start.saturating_sub(first_len);
                self.visit(second, from, end - first_len - from, depth + 1, f)?;
            }
            Ok(())
        } else if representation == tags.thin {
            let actual = self.field(s, fields.thin_actual)?;
            let actual = self.string_object(actual)?;
            self.visit(actual, start, len, depth + 1, f)
        } else if representation == tags.sliced {
            let parent = self.field(s, fields.sliced_parent)?;
            let parent = self.string_object(parent)?;
            let offset = self.smi_field("sliced string", s, fields.sliced_offset)?;
            let offset = u64::try_from(offset)
                .map_err(|_| invalid("sliced string", format!("offset {offset}")))?;
            self.visit(parent, offset + start, len, depth + 1, f)
        } else {
            // External strings keep their characters outside the heap,
            // behind an embedder object.
            Err(invalid("string", "external strings are not read"))
        }
    }

    fn string_object(&mut self, tagged: u64) -> Result<Object, HeapError> {
        let o = self.object("string part", tagged)?;
        if self.is_string(o) {
            Ok(o)
        } else {
            Err(HeapError::WrongType {
                what: "string part",
                found: o.instance_type,
            })
        }
    }
}
