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
 * An observer of `methods` ([name, after(span, firstArgument)] pairs): a
 * function that, given a span, wraps those methods on its prototype if not
 * done yet, and says whether every one of them that the span has reports
 * to `after` (false where one could not be wrapped). Cannot throw.
 */
function methodObserver(methods) {
  /** Per prototype seen: whether its methods report. */
  const observedPrototypes = new WeakMap();
  const installedWrappers = new WeakSet();
  /** Most spans share one class: one comparison before the map lookup. */
  let lastPrototype = null;
  let lastObserved = false;

  /** Wraps `name` where `proto` finds it; whether it reports (or is absent). */
  function observe(proto, name, after) {
    const found = findProperty(proto, name);
    if (found === undefined) return true;
    const { owner, descriptor } = found;
    const original = descriptor.value;
    if (typeof original !== 'function') return false;
    if (installedWrappers.has(original)) return true;
    const redefinable = owner === proto ? descriptor.writable || descriptor.configurable : Object.isExtensible(proto);
    if (!redefinable) return false;
    // The original sees exactly the arguments it was given. The usual
    // counts are passed as named parameters: V8 then inlines the original
    // into the wrapper (and both into the caller), where forwarding
    // `arguments` made every call a generic one.
    const wrapper = {
      [name](first, second) {
        try {
          switch (arguments.length) {
            case 0:
              return original.call(this);
            case 1:
              return original.call(this, first);
            case 2:
              return original.call(this, first, second);
            default:
              return Reflect.apply(original, this, arguments);
          }
        } finally {
          after(this, first);
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
    return true;
  }

  return function observeSpanClass(span) {
    try {
      const proto = Object.getPrototypeOf(span);
      if (proto === lastPrototype) return lastObserved;
      if (proto === null || proto === Object.prototype) return false;
      let observed = observedPrototypes.get(proto);
      if (observed === undefined) {
        observed = true;
        for (const [name, after] of methods) {
          try {
            if (!observe(proto, name, after)) observed = false;
          } catch {
            // A prototype that refuses the property (a Proxy, say): its
            // spans are checked when entered instead.
            observed = false;
          }
        }
        observedPrototypes.set(proto, observed);
      }
      lastPrototype = proto;
      lastObserved = observed;
      return observed;
    } catch {
      // A Proxy span whose getPrototypeOf trap throws: left alone.
      return false;
    }
  };
}

module.exports = { methodObserver };
