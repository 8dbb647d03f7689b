//! The thread-context schemas a reader knows, and what tells them apart: the
//! TLS symbol a module exports. The OTEP 4947 record itself is read by
//! [`crate::record`]; [`nodejs`] walks V8's AsyncContextFrame to one.

pub mod nodejs;

use otel_thread_ctx_abi::{node_schema, process_context, record};
use serde::{Serialize, Serializer};

/// One thread-context schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Schema {
    /// OTEP 4947: the TLS variable points at the thread's current record.
    Record,
    /// `nodejs_v1_dev`: the TLS block says where V8 keeps the current
    /// AsyncContextFrame, which leads to the active span's record.
    Nodejs,
}

impl Schema {
    /// Every schema, in the order a thread's answer is looked for.
    pub const ALL: [Schema; 2] = [Schema::Record, Schema::Nodejs];

    /// The ELF TLS symbol a module that publishes the schema exports.
    pub fn symbol(self) -> &'static str {
        match self {
            Schema::Record => record::TLS_SYMBOL,
            Schema::Nodejs => node_schema::TLS_SYMBOL,
        }
    }

    /// The symbol's size (`st_size`) a conforming writer gives it.
    pub fn symbol_size(self) -> u64 {
        match self {
            Schema::Record => 8,
            Schema::Nodejs => node_schema::SIZE as u64,
        }
    }

    /// The schema's `threadlocal.schema_version`, the name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Schema::Record => process_context::DEFAULT_SCHEMA_VERSION,
            Schema::Nodejs => node_schema::SCHEMA_VERSION,
        }
    }
}

impl std::fmt::Display for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

impl Serialize for Schema {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}
