//! The binary interface between the otel-thread-ctx writer (the Node.js
//! addon and its JavaScript) and every reader (the `otel-thread-ctx` CLI,
//! its eBPF program, external profilers): each layout fact is declared here
//! once, and everything else takes it from here. The crate has no
//! dependencies and changes only when the wire format does.
//!
//! # Thread context ([`record`], [`attrs`]; OTEP 4947)
//! Each thread's ELF TLS variable [`record::TLS_SYMBOL`] (8 bytes, TLSDESC)
//! points at its [`record::ThreadContextRecord`], or is NULL. A reader,
//! while the thread is stopped or interrupted:
//! 1. reads the [`record::HEADER_SIZE`]-byte header at the pointer;
//! 2. ignores the record unless the byte at [`record::OFFSET_VALID`] is
//!    exactly [`record::VALID`];
//! 3. then reads `attrs_data_size` (host endian, at most
//!    [`record::ATTRS_CAPACITY`]) bytes at [`record::OFFSET_ATTRS_DATA`]
//!    and decodes them with [`attrs::entries`]. Key index *i* is entry *i*
//!    of the process context's [`process_context::KEY_MAP_KEY`] list.
//!
//! The owning thread is the only writer, and readers never run concurrently
//! with it: the writer sets `valid = 0`, writes the fields, then
//! `valid = 1`, in program order.
//!
//! # Process context ([`process_context`]; OTEP 4719)
//! One mapping per process, named as one of
//! [`process_context::MAPPING_PATHS`] in `/proc/<pid>/maps`, starts with a
//! [`process_context::HEADER_SIZE`]-byte header whose payload pointer
//! addresses a protobuf `ProcessContext` in the same process. Unlike the
//! thread record it races with readers, who follow a seqlock on the
//! timestamp:
//! 1. read the header; check [`process_context::SIGNATURE`] and
//!    [`process_context::VERSION`]; a timestamp of 0 means an update is in
//!    progress (retry);
//! 2. copy `payload_size` bytes (at most
//!    [`process_context::MAX_PAYLOAD_BYTES`]) from the payload pointer;
//! 3. re-read the timestamp at [`process_context::OFFSET_PUBLISHED_AT`];
//!    if it changed, retry from 1.

//! # Node.js schema ([`node_schema`]; `nodejs_v1_dev`)
//! Each isolate thread's [`node_schema::TLS_SYMBOL`] says where V8 keeps the
//! current AsyncContextFrame; the reader walks from it to the active span's
//! record (the layout above), as [`node_schema`] describes.

#![warn(missing_docs)]

pub mod attrs;
pub mod node_schema;
pub mod process_context;
pub mod record;
