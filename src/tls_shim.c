/*
 * The OTEP 4947 discovery symbol.
 *
 * Rust on stable cannot define an exported ELF TLS variable, so this file does.
 * It is compiled with -mtls-dialect=gnu2 so every access goes through a TLSDESC
 * relocation (R_X86_64_TLSDESC / R_AARCH64_TLSDESC), the dialect profilers
 * expect for a dlopen'ed module. src/exports.map keeps the symbol in .dynsym.
 *
 * Reader contract: otel_thread_ctx_v1 is NULL or points at the calling thread's
 * 64-byte aligned Thread-Local Context Record (see src/record.rs), which stays
 * mapped for the life of the process. Readers only read while the thread is
 * stopped or interrupted, so plain aligned 8-byte stores are enough.
 */
#include <stddef.h>

__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1 = NULL;

/* Points the calling thread's otel_thread_ctx_v1 at record (or NULL). */
void otel_thread_ctx_tls_store(void *record) {
  __atomic_store_n(&otel_thread_ctx_v1, record, __ATOMIC_RELAXED);
  /* ORDER: a sampler interrupting this thread sees the store before anything
   * that follows it in program order. */
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* The calling thread's current pointer. */
void *otel_thread_ctx_tls_load(void) {
  return __atomic_load_n(&otel_thread_ctx_v1, __ATOMIC_RELAXED);
}

/* The address of the calling thread's variable (for diagnostics and tests). */
void *otel_thread_ctx_tls_address(void) { return (void *)&otel_thread_ctx_v1; }
