'use strict';
// Observing span methods (`end()`, `setAttribute()`, ...) without the
// application being able to tell: each observer wraps a method once per
// prototype, as an own property of that prototype with the original's
// attributes, name and length, returning or throwing what the original
// does, and runs its callback (which must not throw) after every call.
// Nothing is added to the application's objects: the prototypes seen and
// the wrappers installed are kept in the observer's own sets, so a method
// it already wraps (inherited from a patched base class) is not wrapped
// twice, and another observer (or another copy of the package) wraps on
// top for its own purpose. Accessors, non-functions and methods that
// cannot be redefined (a frozen prototype, or an inherited method on a
// non-extensible one) are left alone.

/** The descriptor of `name` on `proto` or up its prototype chain, or undefined. */
function findProperty(proto, name) {
  for (let p = proto; p !== null; p = Object.getPrototypeOf(p)) {
    const descriptor = Object.getOwnPropertyDescriptor(p, name);
    if (descriptor !== undefined) return { owner: p, descriptor };
  }
  return undefined;
}

/**
 * An observer of `methods` ([name, after(span)] pairs): a function that,
 * given a span, wraps those methods on its prototype if not done yet.
 * Cannot throw.
 */
function methodObserver(methods) {
  const observedPrototypes = new WeakSet();
  const installedWrappers = new WeakSet();
  /** Most spans share one class: one comparison before the set lookup. */
  let lastPrototype = null;

  function observe(proto, name, after) {
    const found = findProperty(proto, name);
    if (found === undefined) return;
    const { owner, descriptor } = found;
    const original = descriptor.value;
    if (typeof original !== 'function' || installedWrappers.has(original)) return;
    const redefinable = owner === proto ? descriptor.writable || descriptor.configurable : Object.isExtensible(proto);
    if (!redefinable) return;
    const wrapper = {
      [name](...args) {
        try {
          return Reflect.apply(original, this, args);
        } finally {
          after(this);
        }
      },
    }[name];
    Object.defineProperty(wrapper, 'length', { value: original.length });
    installedWrappers.add(wrapper);
    Object.defineProperty(proto, name, {
      value: wrapper,
      writable: descriptor.writable,
      enumerable: descriptor.enumerable,
      configurable: descriptor.configurable,
    });
  }

  return function observeSpanClass(span) {
    try {
      const proto = Object.getPrototypeOf(span);
      if (proto === lastPrototype) return;
      if (proto === null || proto === Object.prototype || observedPrototypes.has(proto)) return;
      observedPrototypes.add(proto);
      lastPrototype = proto;
      for (const [name, after] of methods) {
        try {
          observe(proto, name, after);
        } catch {
          // A Proxy prototype refusing: that method stays unobserved.
        }
      }
    } catch {
      // A Proxy span refusing getPrototypeOf: nothing observed.
    }
  };
}

module.exports = { methodObserver };
