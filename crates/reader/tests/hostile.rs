//! Every parser of bytes a target controls, fed what a hostile or broken
//! process could hold: the record and its attributes, the process context
//! (header, payload, key map, layout keys), the Node.js walk over V8
//! objects, TLS discovery through the DTV, `/proc/<pid>/maps` lines and ELF
//! files. Each must return an error or a bounded result, never panic, loop
//! or allocate what the target asks for.
//!
//! `PROPTEST_CASES` sets the number of cases per property (a longer run:
//! `PROPTEST_CASES=100000 cargo test --release -p otel-thread-ctx-reader --test hostile`).

use std::collections::BTreeMap;

use proptest::collection::vec;
use proptest::prelude::*;

use otel_thread_ctx_abi::node_schema::{self, ThreadContext, DEFAULT_LAYOUT, MAX_CHAIN_HOPS};
use otel_thread_ctx_abi::process_context as pc;
use otel_thread_ctx_otlp::{
    any_value, AnyValue, ArrayValue, KeyValue, KeyValueList, ProcessContext, Resource,
};
use otel_thread_ctx_reader::maps::{self, Mapping};
use otel_thread_ctx_reader::memory::{Memory, MemoryError};
use otel_thread_ctx_reader::process_context::{self as context, Lookup};
use otel_thread_ctx_reader::record;
use otel_thread_ctx_reader::schema::nodejs;
use otel_thread_ctx_reader::tls;

const PAGE: u64 = 4096;

/// A sparse address space: whole pages of given bytes, everything else
/// unmapped. A read fails as a whole unless every byte is mapped.
#[derive(Clone, Debug, Default)]
struct Pages {
    pages: BTreeMap<u64, Vec<u8>>,
}

impl Pages {
    fn map(&mut self, addr: u64, bytes: &[u8]) {
        let mut at = addr;
        for &b in bytes {
            let page = self
                .pages
                .entry(at / PAGE)
                .or_insert_with(|| vec![0; PAGE as usize]);
            page[(at % PAGE) as usize] = b;
            at = at.wrapping_add(1);
        }
    }
}

impl Memory for Pages {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let len = buf.len();
        let fail = || MemoryError {
            addr,
            len,
            reason: "unmapped".into(),
        };
        for (i, out) in buf.iter_mut().enumerate() {
            let at = addr.checked_add(i as u64).ok_or_else(fail)?;
            *out = self.pages.get(&(at / PAGE)).ok_or_else(fail)?[(at % PAGE) as usize];
        }
        Ok(())
    }
}

/// Addresses a hostile target's words point at: inside the few pages the
/// tests map, their edges, and the ends of the address space.
fn address() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0u64..4 * PAGE).prop_map(|o| BASE + o),
        Just(0u64),
        Just(u64::MAX),
        Just(u64::MAX - 7),
        Just(BASE - 1),
        any::<u64>(),
    ]
}

/// Where the tests' pages start.
const BASE: u64 = 0x7f00_0000_0000;

/// A word as V8 or the writer would leave it, or garbage: tagged pointers
/// into the mapped pages, Smis (small integers in the upper half), the
/// "undefined" address, anything.
fn word(undefined: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        address().prop_map(|a| a | 1),
        (-70_000i64..70_000).prop_map(|v| (v as u64) << 32),
        Just(undefined),
        Just((-1i64 as u64) << 32),
        any::<u64>(),
    ]
}

/// Four pages of such words at BASE.
fn heap(undefined: u64) -> impl Strategy<Value = Pages> {
    vec(word(undefined), (4 * PAGE / 8) as usize).prop_map(|words| {
        let mut pages = Pages::default();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        pages.map(BASE, &bytes);
        pages
    })
}

/// A key/value list as a hostile or buggy writer could publish it: the keys
/// readers look for, with values of every kind, nested.
fn any_value() -> impl Strategy<Value = AnyValue> {
    let leaf = prop_oneof![
        ".{0,40}".prop_map(any_value::Value::StringValue),
        any::<i64>().prop_map(any_value::Value::IntValue),
        (0i64..0x200).prop_map(any_value::Value::IntValue),
        any::<bool>().prop_map(any_value::Value::BoolValue),
        vec(any::<u8>(), 0..32).prop_map(any_value::Value::BytesValue),
    ]
    .prop_map(|v| AnyValue { value: Some(v) });
    leaf.prop_recursive(3, 600, 300, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..300).prop_map(|values| AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue { values })),
            }),
            vec((".{0,8}", inner), 0..8).prop_map(|kvs| AnyValue {
                value: Some(any_value::Value::KvlistValue(KeyValueList {
                    values: kvs
                        .into_iter()
                        .map(|(key, v)| KeyValue {
                            key,
                            value: Some(v)
                        })
                        .collect(),
                })),
            }),
        ]
    })
}

fn key_value() -> impl Strategy<Value = KeyValue> {
    let key = prop_oneof![
        Just(pc::KEY_MAP_KEY.to_string()),
        Just(pc::SCHEMA_VERSION_KEY.to_string()),
        Just(node_schema::JS_OBJECT_RECORD_OFFSET_KEY.to_string()),
        proptest::sample::select(node_schema::LAYOUT_KEYS.to_vec()).prop_map(str::to_string),
        Just("threadlocal.other".to_string()),
        ".{0,20}",
    ];
    (key, proptest::option::of(any_value())).prop_map(|(key, value)| KeyValue { key, value })
}

/// The process context mapping: a header naming `payload` at `payload_at`.
fn context_pages(header: [u8; pc::HEADER_SIZE], payload_at: u64, payload: &[u8]) -> Pages {
    let mut pages = Pages::default();
    pages.map(BASE, &header);
    pages.map(payload_at, payload);
    pages
}

fn header(payload_size: u32, payload: u64, published_at: u64) -> [u8; pc::HEADER_SIZE] {
    let mut h = [0u8; pc::HEADER_SIZE];
    h[..8].copy_from_slice(&pc::SIGNATURE);
    h[pc::OFFSET_VERSION..pc::OFFSET_VERSION + 4].copy_from_slice(&pc::VERSION.to_le_bytes());
    h[pc::OFFSET_PAYLOAD_SIZE..pc::OFFSET_PAYLOAD_SIZE + 4]
        .copy_from_slice(&payload_size.to_le_bytes());
    h[pc::OFFSET_PUBLISHED_AT..pc::OFFSET_PUBLISHED_AT + 8]
        .copy_from_slice(&published_at.to_le_bytes());
    h[pc::OFFSET_PAYLOAD..pc::OFFSET_PAYLOAD + 8].copy_from_slice(&payload.to_le_bytes());
    h
}

fn context_mapping() -> Mapping {
    maps::parse(&format!(
        "{:x}-{:x} rw-p 00000000 00:00 0 {}\n",
        BASE,
        BASE + PAGE,
        pc::MAPPING_PATHS[0]
    ))
    .remove(0)
}

/// Where the structured heap puts each object (untagged).
const SLOT: u64 = BASE;
const ALS_HANDLE: u64 = BASE + 0x10;
const ALS: u64 = BASE + 0x20;
const FRAME: u64 = BASE + 0x100;
const TABLE: u64 = BASE + 0x400;
const WRAPPER: u64 = BASE + 0x2000;
const RECORD: u64 = BASE + 0x3000;

/// An OrderedHashMap entry: its key is the writer's AsyncLocalStorage or
/// another, its value a wrapper or anything, its chain link any index.
fn entry() -> impl Strategy<Value = (bool, Option<u64>, i64)> {
    (any::<bool>(), proptest::option::of(word(0)), -2i64..10)
}

/// A heap laid out as the Node.js walk expects (slot, frame, table,
/// entries, wrapper, record), with counts, links and words that may be
/// wrong, then a few words overwritten with anything: what a process in
/// the middle of a write, or a hostile one, leaves.
fn v8_heap() -> impl Strategy<Value = (Pages, ThreadContext)> {
    (
        prop_oneof![Just(1i64), Just(2), Just(4), Just(8), -1i64..70_000],
        0i64..20,
        0i64..3,
        vec(-2i64..10, 8),
        vec(entry(), 0..16),
        any::<i32>(),
        vec(any::<u8>(), record::HEADER_SIZE + 64),
        any::<bool>(),
        vec((0u64..0x3100 / 8, word(0)), 0..4),
    )
        .prop_map(
            |(buckets, elements, deleted, heads, entries, hash, mut rec, valid, corruptions)| {
                let undefined = BASE + 0x8;
                let mut pages = Pages::default();
                let put = |pages: &mut Pages, at: u64, w: u64| pages.map(at, &w.to_ne_bytes());
                let smi = |v: i64| (v as u64) << 32;
                put(&mut pages, SLOT, FRAME | 1);
                put(&mut pages, ALS_HANDLE, ALS | 1);
                put(
                    &mut pages,
                    FRAME + DEFAULT_LAYOUT.js_map_table_offset,
                    TABLE | 1,
                );
                let base = TABLE + DEFAULT_LAYOUT.ordered_hash_map_header_size;
                put(&mut pages, base, smi(elements));
                put(&mut pages, base + 8, smi(deleted));
                put(&mut pages, base + 16, smi(buckets));
                let bucket_words = buckets.clamp(0, 8) as u64;
                for b in 0..bucket_words {
                    put(
                        &mut pages,
                        base + (node_schema::TABLE_PREFIX_WORDS + b) * 8,
                        smi(heads[b as usize]),
                    );
                }
                let first_entry = base + (node_schema::TABLE_PREFIX_WORDS + bucket_words) * 8;
                for (i, (ours, value, link)) in entries.iter().enumerate() {
                    let at = first_entry + i as u64 * node_schema::ENTRY_WORDS * 8;
                    put(
                        &mut pages,
                        at,
                        if *ours { ALS | 1 } else { (ALS + 0x40) | 1 },
                    );
                    put(&mut pages, at + 8, value.unwrap_or(WRAPPER | 1));
                    put(&mut pages, at + 16, smi(*link));
                }
                put(
                    &mut pages,
                    WRAPPER + DEFAULT_LAYOUT.js_object_record_offset,
                    RECORD,
                );
                if valid {
                    rec[otel_thread_ctx_abi::record::OFFSET_VALID] = 1;
                }
                pages.map(RECORD, &rec);
                for (index, w) in corruptions {
                    put(&mut pages, BASE + index * 8, w);
                }
                let block = ThreadContext {
                    cped_slot: SLOT,
                    als_handle: ALS_HANDLE,
                    als_identity_hash: hash,
                    padding: 0,
                    undefined_addr: undefined,
                };
                (pages, block)
            },
        )
}

proptest! {
    /// A record anywhere, holding anything: read within its bounds.
    #[test]
    fn a_record_of_any_bytes_reads_within_bounds(
        bytes in vec(any::<u8>(), 0..700),
        offset in 0u64..64,
        with_attrs in any::<bool>(),
    ) {
        let mut pages = Pages::default();
        pages.map(BASE, &bytes);
        if let Ok(rec) = record::read(&pages, BASE + offset, with_attrs) {
            prop_assert!(rec.attrs_data.len() <= record::MAX_ATTRS_DATA);
            prop_assert!(rec.attrs_data.len() <= rec.header.attrs_data_size as usize);
            let attrs = record::decode_attributes(&rec.attrs_data);
            prop_assert!(attrs.entries.len() <= 256);
        }
    }

    /// attrs_data of any bytes: entries, each value at most 255 bytes, and
    /// never more bytes than given.
    #[test]
    fn attributes_of_any_bytes_decode_within_bounds(data in vec(any::<u8>(), 0..1024)) {
        let attrs = record::decode_attributes(&data);
        let total: usize = attrs.entries.iter().map(|e| 2 + e.value.len()).sum();
        prop_assert!(attrs.trailing_bytes <= data.len());
        prop_assert!(total <= data.len());
        for e in &attrs.entries {
            prop_assert!(e.value.len() <= 255);
        }
        let mut keys: Vec<u8> = attrs.entries.iter().map(|e| e.key_index).collect();
        keys.dedup();
        prop_assert_eq!(keys.len(), attrs.entries.len());
    }

    /// A process context header of any bytes, its payload anywhere: an
    /// error or a payload within the limit.
    #[test]
    fn a_process_context_of_any_header_reads_within_bounds(
        raw in vec(any::<u8>(), pc::HEADER_SIZE),
        payload_size in prop_oneof![0u32..300, Just(u32::MAX), any::<u32>()],
        payload_at in address(),
        published_at in prop_oneof![Just(0u64), 1u64..10, any::<u64>()],
        signed in any::<bool>(),
        payload in vec(any::<u8>(), 0..300),
    ) {
        let mut h: [u8; pc::HEADER_SIZE] = raw.try_into().unwrap();
        if signed {
            h = header(payload_size, payload_at, published_at);
        }
        let pages = context_pages(h, payload_at, &payload);
        if let Ok((_, bytes)) = context::read_consistent(&pages, BASE) {
            prop_assert!(bytes.len() <= pc::MAX_PAYLOAD_BYTES);
        }
        let _ = context::lookup(&[context_mapping()], &pages);
    }

    /// A well-framed process context whose payload says anything: the
    /// interpretation keeps to what is addressable.
    #[test]
    fn a_process_context_of_any_attributes_is_interpreted_safely(
        attributes in vec(key_value(), 0..12),
        resource in vec(key_value(), 0..4),
    ) {
        let message = ProcessContext {
            resource: Some(Resource {
                attributes: resource,
                ..Default::default()
            }),
            attributes,
        };
        let payload = prost::Message::encode_to_vec(&message);
        prop_assume!(payload.len() <= pc::MAX_PAYLOAD_BYTES);
        let payload_at = BASE + 2 * PAGE;
        let pages = context_pages(header(payload.len() as u32, payload_at, 1), payload_at, &payload);
        match context::lookup(&[context_mapping()], &pages) {
            Lookup::Found(found) => {
                let layout = found.v8_layout.unwrap_or(DEFAULT_LAYOUT);
                for v in [layout.js_object_record_offset, layout.tagged_size, layout.js_map_table_offset, layout.ordered_hash_map_header_size] {
                    prop_assert!(v <= 1 << 20);
                }
            }
            Lookup::Invalid { .. } => {}
            Lookup::Absent => prop_assert!(false, "the mapping was not looked at"),
        }
    }

    /// The Node.js walk over a heap of V8-like words, pointer cycles and
    /// garbage included: ends in a bounded number of steps, and a record it
    /// returns was read from mapped memory.
    #[test]
    fn the_nodejs_walk_over_any_heap_ends(
        undefined in address(),
        pages in address().prop_flat_map(heap),
        cped_slot in address(),
        als_handle in address(),
        als_identity_hash in any::<i32>(),
        record_offset in prop_oneof![Just(DEFAULT_LAYOUT.js_object_record_offset), 0u64..(1 << 20)],
        header_size in prop_oneof![Just(DEFAULT_LAYOUT.ordered_hash_map_header_size), 0u64..(1 << 20)],
        table_offset in prop_oneof![Just(DEFAULT_LAYOUT.js_map_table_offset), 0u64..(1 << 20)],
        with_attrs in any::<bool>(),
    ) {
        let block = ThreadContext { cped_slot, als_handle, als_identity_hash, padding: 0, undefined_addr: undefined };
        let layout = node_schema::V8Layout {
            js_object_record_offset: record_offset,
            tagged_size: 8,
            js_map_table_offset: table_offset,
            ordered_hash_map_header_size: header_size,
        };
        let mut trail = nodejs::Trail::default();
        let _ = nodejs::walk(&pages, &block, &layout, &mut trail);
        prop_assert!(trail.hops <= MAX_CHAIN_HOPS);
        // The whole read, from a block the heap holds.
        let mut with_block = pages.clone();
        let block_at = BASE + 4 * PAGE;
        let mut bytes = [0u8; node_schema::SIZE];
        bytes[node_schema::OFFSET_CPED_SLOT..][..8].copy_from_slice(&cped_slot.to_ne_bytes());
        bytes[node_schema::OFFSET_ALS_HANDLE..][..8].copy_from_slice(&als_handle.to_ne_bytes());
        bytes[node_schema::OFFSET_ALS_IDENTITY_HASH..][..4].copy_from_slice(&als_identity_hash.to_ne_bytes());
        bytes[node_schema::OFFSET_UNDEFINED_ADDR..][..8].copy_from_slice(&undefined.to_ne_bytes());
        with_block.map(block_at, &bytes);
        let mut trail = nodejs::Trail::default();
        if let Ok(rec) = nodejs::read(&with_block, block_at, &layout, with_attrs, &mut trail) {
            prop_assert!(rec.header.is_valid());
            prop_assert!(rec.attrs_data.len() <= record::MAX_ATTRS_DATA);
        }
        prop_assert!(trail.hops <= MAX_CHAIN_HOPS);
    }

    /// The Node.js walk over a heap shaped as it expects, with wrong
    /// counts, chain cycles and overwritten words: ends within the chain
    /// bound; a record it returns is valid and bounded.
    #[test]
    fn the_nodejs_walk_over_a_damaged_v8_heap_ends((pages, block) in v8_heap(), with_attrs in any::<bool>()) {
        let mut trail = nodejs::Trail::default();
        let walked = nodejs::walk(&pages, &block, &DEFAULT_LAYOUT, &mut trail);
        prop_assert!(trail.hops <= MAX_CHAIN_HOPS);
        if let Ok(address) = walked {
            prop_assert_eq!(Some(address), trail.record);
        }
        let mut with_block = pages.clone();
        let block_at = BASE + 4 * PAGE;
        let mut bytes = [0u8; node_schema::SIZE];
        bytes[node_schema::OFFSET_CPED_SLOT..][..8].copy_from_slice(&block.cped_slot.to_ne_bytes());
        bytes[node_schema::OFFSET_ALS_HANDLE..][..8].copy_from_slice(&block.als_handle.to_ne_bytes());
        bytes[node_schema::OFFSET_ALS_IDENTITY_HASH..][..4].copy_from_slice(&block.als_identity_hash.to_ne_bytes());
        bytes[node_schema::OFFSET_UNDEFINED_ADDR..][..8].copy_from_slice(&block.undefined_addr.to_ne_bytes());
        with_block.map(block_at, &bytes);
        let mut trail = nodejs::Trail::default();
        if let Ok(rec) = nodejs::read(&with_block, block_at, &DEFAULT_LAYOUT, with_attrs, &mut trail) {
            prop_assert!(rec.header.is_valid());
            prop_assert!(rec.attrs_data.len() <= record::MAX_ATTRS_DATA);
        }
    }

    /// TLS through a DTV of any words: an address, "not allocated" or an
    /// error.
    #[test]
    fn tls_through_any_dtv_is_located_or_refused(
        pages in heap(0),
        tp in address(),
        module_id in prop_oneof![0u64..8, any::<u64>()],
        offset in prop_oneof![0u64..4096, any::<u64>()],
        tp_offset in any::<i64>(),
    ) {
        for plan in [tls::Plan::Dtv { module_id, offset }, tls::Plan::Static { tp_offset }] {
            let _ = tls::locate(&plan, tp, &pages, &tls::X86_64);
        }
    }

    /// `/proc/<pid>/maps` text of any shape (a path may hold anything).
    #[test]
    fn maps_lines_of_any_text_parse_or_are_skipped(
        lines in vec(prop_oneof![
            ".{0,120}",
            "[0-9a-f]{1,16}-[0-9a-f]{1,16} [rwxps-]{4} [0-9a-f]{1,16} [0-9a-f:]{1,8} [0-9]{1,12} {0,20}.{0,40}",
        ], 0..20),
    ) {
        let text = lines.join("\n");
        for m in maps::parse(&text) {
            let _ = (m.name(), m.is_file_backed(), m.len(), m.is_empty());
        }
    }
}

/// An ELF header for x86-64 whose table offsets and counts point inside
/// `size` bytes of whatever follows.
fn elf_file() -> impl Strategy<Value = Vec<u8>> {
    (
        vec(any::<u8>(), 64..8192),
        0u64..8192,
        0u16..16,
        0u64..8192,
        0u16..32,
        0u16..32,
        any::<bool>(),
    )
        .prop_map(
            |(mut bytes, phoff, phnum, shoff, shnum, shstrndx, dynamic)| {
                bytes[..4].copy_from_slice(b"\x7fELF");
                bytes[4] = 2; // 64-bit
                bytes[5] = 1; // little-endian
                bytes[6] = 1; // version
                bytes[16..18].copy_from_slice(&(if dynamic { 3u16 } else { 2 }).to_le_bytes());
                bytes[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
                bytes[20..24].copy_from_slice(&1u32.to_le_bytes());
                bytes[32..40].copy_from_slice(&phoff.to_le_bytes());
                bytes[40..48].copy_from_slice(&shoff.to_le_bytes());
                bytes[52..54].copy_from_slice(&64u16.to_le_bytes());
                bytes[54..56].copy_from_slice(&56u16.to_le_bytes());
                bytes[56..58].copy_from_slice(&phnum.to_le_bytes());
                bytes[58..60].copy_from_slice(&64u16.to_le_bytes());
                bytes[60..62].copy_from_slice(&shnum.to_le_bytes());
                bytes[62..64].copy_from_slice(&shstrndx.to_le_bytes());
                bytes
            },
        )
}

proptest! {
    /// An ELF file of any contents behind a valid header: analysed or
    /// refused.
    #[test]
    fn elf_files_of_any_contents_are_analysed_or_refused(data in elf_file(), raw in vec(any::<u8>(), 0..256)) {
        for symbol in [node_schema::TLS_SYMBOL, "otel_thread_ctx_v1"] {
            if let Ok(Some(def)) = otel_thread_ctx_reader::elf::analyze(&data, symbol) {
                let _ = (def.access_model(true), def.access_model(false), def.load_bias(BASE, 0));
            }
            let _ = otel_thread_ctx_reader::elf::analyze(&raw, symbol);
        }
    }
}
