'use strict';
// The Node.js schema's walk (`nodejs_v1_dev`) as bpftrace statements, for
// samplers that check frame mode from the kernel without our reader:
//
//   block   = fs_base + tpoff                 (otel_thread_ctx_nodejs_v1)
//   frame   = *block.cped_slot                (0 slot: not published; undefined: idle)
//   table   = *(frame - 1 + js_map_table_offset)
//   counts  = 3 Smis at table - 1 + ordered_hash_map_header_size, then the
//             bucket heads, then {key, value, chain} entries
//   wrapper = the value of the entry whose key is *block.als_handle,
//             found from bucket als_identity_hash & (buckets - 1)
//   record  = *(wrapper - 1 + js_object_record_offset)
//
// Every constant comes from the addon's ABI (js/abi.js, declared once in
// abi/src/node_schema.rs); the record offset in the wrapper is the one the
// writer published (threadInfo().frame.jsObjectRecordOffset, also in the
// process context). Every read goes through bpftrace's user-memory probe
// read (a fault reads 0), every count and index is bounded, and anything
// unexpected leaves `$p` at 0: no span, never a guess.

const { nodeSchema } = require('../js/abi');

const { offsets, defaultLayout } = nodeSchema;
const WORD = defaultLayout.taggedSize;
if (WORD !== 8 || nodeSchema.smiShift !== 32 || nodeSchema.heapObjectTag !== 1) {
  throw new Error('nodejs-walk: the schema is not the x86-64 uncompressed layout this program reads');
}
/** A Smi word's payload lives in the high 32 bits; the low 32 are zero. */
const SMI_LOW_MASK = '0xffffffff';

/** `fs_base + offset` as bpftrace arithmetic (offset is negative for static TLS). */
function threadVariable(offset) {
  return offset < 0n ? `curtask->thread.fsbase - ${-offset}` : `curtask->thread.fsbase + ${offset}`;
}

/**
 * bpftrace statements that leave in `$p` the record address a Node.js
 * schema reader finds for the current thread, or 0. `offset`: the static
 * TLS offset of otel_thread_ctx_nodejs_v1 from fs_base (BigInt);
 * `recordOffset`: the wrapper's record offset (defaults to the schema's).
 * Uses variables prefixed `$n_`.
 */
function walkStatements({ offset, recordOffset = defaultLayout.jsObjectRecordOffset }) {
  const u64 = (expr) => `*(uint64 *)uptr(${expr})`;
  const prefix = nodeSchema.tablePrefixWords;
  const entryBytes = nodeSchema.entryWords * WORD;
  const hops = nodeSchema.maxChainHops;
  return `
      $p = (uint64)0;
      $n_block = ${threadVariable(offset)};
      $n_slot = ${u64(`$n_block + ${offsets.cpedSlot}`)};
      if ($n_slot != 0) {
        $n_undef = ${u64(`$n_block + ${offsets.undefinedAddr}`)};
        $n_frame = ${u64('$n_slot')};
        if ($n_frame != $n_undef && ($n_frame & 1) == 1) {
          $n_table = ${u64(`$n_frame - 1 + ${defaultLayout.jsMapTableOffset}`)};
          $n_base = $n_table - 1 + ${defaultLayout.orderedHashMapHeaderSize};
          $n_elements = ${u64('$n_base')};
          $n_deleted = ${u64(`$n_base + ${WORD}`)};
          $n_buckets = ${u64(`$n_base + ${2 * WORD}`)};
          $n_smis = ($n_elements & ${SMI_LOW_MASK}) == 0 && ($n_deleted & ${SMI_LOW_MASK}) == 0 && ($n_buckets & ${SMI_LOW_MASK}) == 0;
          $n_count = $n_buckets >> 32;
          $n_used = ($n_elements >> 32) + ($n_deleted >> 32);
          if (($n_table & 1) == 1 && $n_smis && $n_count > 0 && $n_count <= ${nodeSchema.maxBuckets} &&
              ($n_count & ($n_count - 1)) == 0 && $n_used <= 2 * $n_count) {
            $n_key = ${u64(u64(`$n_block + ${offsets.alsHandle}`))};
            $n_hash = (uint64)*(uint32 *)uptr($n_block + ${offsets.alsIdentityHash});
            $n_index = ${u64(`$n_base + (${prefix} + ($n_hash & ($n_count - 1))) * ${WORD}`)};
            $n_entries = $n_base + (${prefix} + $n_count) * ${WORD};
            $n_value = (uint64)0;
            $n_found = 0;
            $n_done = 0;
            unroll(${hops}) {
              if ($n_done == 0) {
                // The end of the chain (Smi ${nodeSchema.notFound}) is out of range too.
                if (($n_index & ${SMI_LOW_MASK}) != 0 || ($n_index >> 32) >= $n_used) {
                  $n_done = 1;
                } else {
                  $n_entry = $n_entries + ($n_index >> 32) * ${entryBytes};
                  if (${u64('$n_entry')} == $n_key) {
                    $n_value = ${u64(`$n_entry + ${WORD}`)};
                    $n_found = 1;
                    $n_done = 1;
                  } else {
                    $n_index = ${u64(`$n_entry + ${2 * WORD}`)};
                  }
                }
              }
            }
            if ($n_found == 1 && $n_value != $n_undef && ($n_value & 1) == 1) {
              $p = ${u64(`$n_value - 1 + ${recordOffset}`)};
            }
          }
        }
      }`;
}

module.exports = { walkStatements, threadVariable };
