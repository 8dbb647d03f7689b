'use strict';
// State the package keeps for objects it does not own (contexts, spans):
// a private field added from outside the object's class, through a base
// constructor that returns the object it is given.
//
// Private elements are not properties: Reflect.ownKeys, Object.keys,
// for-in, JSON, structured clone, util.inspect and assert's comparisons
// never see them, and one can be added to a frozen object or a Proxy
// without running a trap. So the application's objects look and compare
// exactly as it made them. A WeakMap gives the same guarantees but makes
// every entry an ephemeron the garbage collector must process, which with
// one per span and per context made a traced server's scavenges far
// longer (BENCHMARKS.md, "Where a request's extra microseconds go").
//
// Each kind of state is its own class written out where it is used
// (`class XSlot extends Stamp { #x; ... }`), not one class made by a
// factory: the accesses of a factory's class are shared code, and each of
// its private names would make them polymorphic.

/** Returns its argument from a constructor, so a subclass's private fields land on that object. */
class Stamp {
  constructor(target) {
    // eslint-disable-next-line no-constructor-return
    return target;
  }
}

module.exports = { Stamp };
