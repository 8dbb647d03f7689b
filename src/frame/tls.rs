//! The `otel_thread_ctx_nodejs_v1` TLS block readers discover (defined in
//! `src/tls_shim.c` next to `otel_thread_ctx_v1`, exported through
//! `src/exports.map`).

use otel_thread_ctx_abi::node_schema::ThreadContext;

extern "C" {
    fn otel_thread_ctx_nodejs_store(block: *const ThreadContext);
    fn otel_thread_ctx_nodejs_gate(cped_slot: u64);
    fn otel_thread_ctx_nodejs_load(out: *mut ThreadContext);
    fn otel_thread_ctx_nodejs_address() -> *mut ThreadContext;
}

/// Fills the calling thread's block, `cped_slot` (the gate) last.
pub fn store(block: &ThreadContext) {
    // SAFETY: the shim only writes the calling thread's own block.
    unsafe { otel_thread_ctx_nodejs_store(block) }
}

/// Sets only the calling thread's gate (`cped_slot`); 0 closes it.
pub fn gate(cped_slot: u64) {
    // SAFETY: as above.
    unsafe { otel_thread_ctx_nodejs_gate(cped_slot) }
}

/// A copy of the calling thread's block.
pub fn load() -> ThreadContext {
    let mut block = ThreadContext::default();
    // SAFETY: as above; `block` is a valid destination of the block's size.
    unsafe { otel_thread_ctx_nodejs_load(&mut block) };
    block
}

/// Address of the calling thread's block.
pub fn address() -> usize {
    // SAFETY: taking the address of our own TLS variable has no side effect.
    unsafe { otel_thread_ctx_nodejs_address() as usize }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_has_its_own_block_and_the_gate_closes_alone() {
        let block = ThreadContext {
            cped_slot: 0x1000,
            als_handle: 0x2000,
            als_identity_hash: 7,
            padding: 0,
            undefined_addr: 0x3001,
        };
        store(&block);
        assert_eq!(load(), block);
        let other = std::thread::spawn(|| (load(), address())).join().unwrap();
        assert_eq!(other.0, ThreadContext::default());
        assert_ne!(other.1, address());
        gate(0);
        assert_eq!(
            load(),
            ThreadContext {
                cped_slot: 0,
                ..block
            }
        );
        store(&ThreadContext::default());
    }

    #[test]
    fn the_shim_and_the_version_script_name_the_abi_symbol() {
        use otel_thread_ctx_abi::node_schema::TLS_SYMBOL;
        assert!(include_str!("../tls_shim.c").contains(&format!("{TLS_SYMBOL} = {{")));
        assert!(include_str!("../exports.map").contains(&format!(" {TLS_SYMBOL};")));
    }
}
