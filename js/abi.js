'use strict';
// The wire layout of the thread record (OTEP 4947) and the process context
// (OTEP 4719), as the addon's ABI crate declares it (abi/): record offsets
// and sizes, the attribute entry limits, the process-context header and
// names, and the Node.js schema's thread block and walk constants. Read
// once at load, frozen; JavaScript declares none of it itself.
//
// { record: { headerSize, size, attrsCapacity, offsets: { traceId, spanId,
//     valid, traceFlags, attrsDataSize, attrsData }, valid, tlsSymbol },
//   attrs: { maxValueBytes },
//   processContext: { signature, version, headerSize, maxPayloadBytes,
//     maxKeys, mappingName, schemaVersionKey, keyMapKey, defaultSchemaVersion },
//   nodeSchema: { tlsSymbol, schemaVersion, size, offsets: { cpedSlot,
//     alsHandle, alsIdentityHash, undefinedAddr }, defaultLayout: {
//     jsObjectRecordOffset, taggedSize, jsMapTableOffset,
//     orderedHashMapHeaderSize }, layoutKeys, tablePrefixWords, entryWords,
//     notFound, maxChainHops, maxBuckets, heapObjectTag, smiShift } }

const { loadAddon } = require('./native');

function deepFreeze(value) {
  for (const child of Object.values(value)) {
    if (typeof child === 'object' && child !== null) deepFreeze(child);
  }
  return Object.freeze(value);
}

module.exports = deepFreeze(loadAddon().abiLayout());
