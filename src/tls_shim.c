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
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

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

/*
 * Where glibc put this module's TLS block for the calling thread, read from
 * the TLSDESC descriptor of otel_thread_ctx_v1 as the dynamic linker filled it
 * (the same two words an outside reader reads from the GOT):
 * - static TLS: the descriptor's argument is the variable's offset from the
 *   thread pointer (the static resolver returns it unchanged), so
 *   thread pointer + argument == &otel_thread_ctx_v1, exactly;
 * - dynamic TLS: the argument points to a tls_index {module, offset} naming
 *   this module, and this thread's block for the module (dlinfo
 *   RTLD_DI_TLS_DATA, the block the DTV holds) + offset == &otel_thread_ctx_v1.
 * Both are identities checked against the variable's real address, not a
 * guess from where the address happens to lie; anything else is "unknown".
 * When this object is linked into an executable (the crate's unit tests), the
 * linker relaxes the descriptor load into the variable's offset itself, which
 * the first identity also recognises.
 */
enum { OTEL_TLS_UNKNOWN = 0, OTEL_TLS_STATIC = 1, OTEL_TLS_DYNAMIC = 2 };

/* Lowest address of the kernel half: user-space pointers lie below it. */
#define USER_SPACE_END ((uintptr_t)1 << 47)

struct tlsdesc_words {
  volatile uintptr_t resolver;
  volatile uintptr_t argument;
};

struct tls_index_words {
  uintptr_t module;
  uintptr_t offset;
};

/* This module's TLS module id and the calling thread's block of it. */
static int own_tls_block(uintptr_t *module, uintptr_t *block) {
  Dl_info info;
  if (dladdr((void *)&own_tls_block, &info) == 0 || info.dli_fname == NULL) return 0;
  void *handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == NULL) return 0;
  size_t modid = 0;
  void *data = NULL;
  int ok = dlinfo(handle, RTLD_DI_TLS_MODID, &modid) == 0 && modid != 0 &&
           dlinfo(handle, RTLD_DI_TLS_DATA, &data) == 0 && data != NULL;
  dlclose(handle);
  *module = modid;
  *block = (uintptr_t)data;
  return ok;
}

int otel_thread_ctx_tls_model(void) {
#if defined(__x86_64__)
  uintptr_t variable = (uintptr_t)&otel_thread_ctx_v1;
  uintptr_t thread_pointer, descriptor;
  /* x86-64 TCB: its first word is its own address, the thread pointer. */
  __asm__("movq %%fs:0, %0" : "=r"(thread_pointer));
  /* The GOT address of the variable's descriptor: the first half of the
   * TLSDESC call sequence, without the call. */
  __asm__("leaq otel_thread_ctx_v1@TLSDESC(%%rip), %0" : "=r"(descriptor));
  if (descriptor >= USER_SPACE_END) {
    /* Relaxed at link time into a thread-pointer offset (executables). */
    return thread_pointer + descriptor == variable ? OTEL_TLS_STATIC : OTEL_TLS_UNKNOWN;
  }
  const struct tlsdesc_words *words = (const struct tlsdesc_words *)descriptor;
  uintptr_t argument = words->argument;
  if (thread_pointer + argument == variable) return OTEL_TLS_STATIC;
  uintptr_t module, block;
  if (argument == 0 || argument >= USER_SPACE_END || !own_tls_block(&module, &block)) return OTEL_TLS_UNKNOWN;
  const struct tls_index_words *index = (const struct tls_index_words *)argument;
  if (index->module == module && block + index->offset == variable) return OTEL_TLS_DYNAMIC;
  return OTEL_TLS_UNKNOWN;
#else
  return OTEL_TLS_UNKNOWN;
#endif
}

/*
 * The Node.js schema's discovery block (nodejs_v1_dev; layout in
 * abi/src/node_schema.rs): where V8 keeps this isolate thread's current
 * AsyncContextFrame, and how to find the writer's AsyncLocalStorage in it.
 * Same TLSDESC dialect and export as otel_thread_ctx_v1.
 *
 * cped_slot is the gate: 0 = the thread publishes nothing. It is written last
 * when the block is filled and cleared first when it is torn down, so a
 * sampler interrupting this thread never follows a half-written block.
 */
struct otel_thread_ctx_nodejs {
  uint64_t cped_slot;
  uint64_t als_handle;
  int32_t als_identity_hash;
  uint32_t padding;
  uint64_t undefined_addr;
};

__attribute__((visibility("default"))) __thread struct otel_thread_ctx_nodejs
    otel_thread_ctx_nodejs_v1 = {0, 0, 0, 0, 0};

/* Fills the calling thread's block; the gate opens last. */
void otel_thread_ctx_nodejs_store(const struct otel_thread_ctx_nodejs *block) {
  struct otel_thread_ctx_nodejs *own = &otel_thread_ctx_nodejs_v1;
  __atomic_store_n(&own->cped_slot, 0, __ATOMIC_RELAXED);
  /* ORDER: the gate is closed before any other field changes. */
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&own->als_handle, block->als_handle, __ATOMIC_RELAXED);
  __atomic_store_n(&own->als_identity_hash, block->als_identity_hash, __ATOMIC_RELAXED);
  __atomic_store_n(&own->padding, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&own->undefined_addr, block->undefined_addr, __ATOMIC_RELAXED);
  /* ORDER: every field is in place before the gate opens. */
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&own->cped_slot, block->cped_slot, __ATOMIC_RELAXED);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* Sets only the gate (0 closes it): for closing and reopening around GC. */
void otel_thread_ctx_nodejs_gate(uint64_t cped_slot) {
  __atomic_store_n(&otel_thread_ctx_nodejs_v1.cped_slot, cped_slot, __ATOMIC_RELAXED);
  /* ORDER: a sampler interrupting this thread sees the gate as stored before
   * anything that follows in program order. */
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* A copy of the calling thread's block. */
void otel_thread_ctx_nodejs_load(struct otel_thread_ctx_nodejs *out) {
  *out = otel_thread_ctx_nodejs_v1;
}

/* The address of the calling thread's block. */
void *otel_thread_ctx_nodejs_address(void) { return (void *)&otel_thread_ctx_nodejs_v1; }
