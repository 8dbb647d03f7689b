'use strict';
// State the package keeps for objects it does not own (contexts, spans):
// one value per object, in a private field added from outside the object's
// class (a base constructor that returns the object it is given).
//
// Private elements are not properties: Reflect.ownKeys, Object.keys,
// for-in, JSON, structured clone, util.inspect and assert's comparisons
// never see them, and one can be added to a frozen object or a Proxy
// without running a trap. So the application's objects look and compare
// exactly as it made them. A WeakMap gives the same guarantees but makes
// every entry an ephemeron the garbage collector must process, which with
// one per span and per context made a traced server's scavenges far
// longer (BENCHMARKS.md, "Where a request's extra microseconds go").

/** Returns its argument from a constructor, so a subclass's fields land on that object. */
class Stamp {
  constructor(target) {
    // eslint-disable-next-line no-constructor-return
    return target;
  }
}

/**
 * A new private slot: `get(object)` (undefined while unset) and
 * `set(object, value)`. Each call makes a distinct slot. `object` must be
 * an object or a function (callers check).
 */
function privateSlot() {
  class Slot extends Stamp {
    #value;

    constructor(target, value) {
      super(target);
      this.#value = value;
    }

    static get(target) {
      return #value in target ? target.#value : undefined;
    }

    static set(target, value) {
      if (#value in target) target.#value = value;
      else new Slot(target, value);
    }
  }
  return { get: Slot.get, set: Slot.set };
}

module.exports = { privateSlot };
