//! `--endpoint`, `--span-name`, `--trace-id`: which samples an output keeps.
//!
//! Each option can be given several times: a sample matches an option when
//! it matches one of its values, and is kept when it matches every option
//! given. A sample outside any span matches none of them.

use otel_thread_ctx_profiler::model::{endpoint, Entry, Profile};

/// What to keep; empty keeps everything.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Endpoints (`GET /users/:id`) or routes (`/users/:id`).
    pub endpoints: Vec<String>,
    pub span_names: Vec<String>,
    pub trace_ids: Vec<[u8; 16]>,
}

/// A trace id as 32 hex digits (either case), not all zero.
pub fn parse_trace_id(s: &str) -> Result<[u8; 16], String> {
    let bad = || format!("{s:?} is not a trace id: 32 hex digits, not all zero");
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut id = [0u8; 16];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    if id == [0; 16] {
        return Err(bad());
    }
    Ok(id)
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty() && self.span_names.is_empty() && self.trace_ids.is_empty()
    }

    /// Whether a sample with this trace and these record attributes is kept.
    pub fn matches<'a>(
        &self,
        trace_id: Option<[u8; 16]>,
        attribute: impl Fn(&str) -> Option<&'a str>,
    ) -> bool {
        if self.is_empty() {
            return true;
        }
        let Some(trace_id) = trace_id else {
            return false;
        };
        let endpoint_ok = self.endpoints.is_empty() || {
            let full = endpoint(&attribute);
            // The route alone matches too, without the method.
            let route = attribute(otel_thread_ctx_abi::attrs::ROUTE_KEY);
            self.endpoints
                .iter()
                .any(|e| full.as_deref() == Some(e.as_str()) || route == Some(e.as_str()))
        };
        let name_ok = self.span_names.is_empty()
            || attribute(otel_thread_ctx_abi::attrs::SPAN_NAME_KEY)
                .is_some_and(|n| self.span_names.iter().any(|x| x == n));
        let trace_ok = self.trace_ids.is_empty() || self.trace_ids.contains(&trace_id);
        endpoint_ok && name_ok && trace_ok
    }

    pub fn matches_entry(&self, e: &Entry) -> bool {
        self.matches(e.span.map(|s| s.trace_id), |k| e.attribute(k))
    }

    /// Keeps the samples that match; returns how many samples (events)
    /// there were and how many are kept.
    pub fn apply(&self, p: &mut Profile) -> (usize, usize) {
        let count = |p: &Profile| p.entries.iter().map(|e| e.events.len()).sum::<usize>();
        let before = count(p);
        if !self.is_empty() {
            p.entries.retain(|e| self.matches_entry(e));
        }
        (before, count(p))
    }

    /// The options as given, for messages: `--endpoint /a --trace-id ...`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for e in &self.endpoints {
            parts.push(format!("--endpoint {e:?}"));
        }
        for n in &self.span_names {
            parts.push(format!("--span-name {n:?}"));
        }
        for t in &self.trace_ids {
            parts.push(format!(
                "--trace-id {}",
                opentelemetry::trace::TraceId::from_bytes(*t)
            ));
        }
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_are_32_hex_digits() {
        assert_eq!(
            parse_trace_id("0707070707070707070707070707070A").unwrap(),
            [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 10]
        );
        for bad in [
            "",
            "07",
            &"0".repeat(32),
            &"g".repeat(32),
            &"07".repeat(17),
            "+7070707070707070707070707070707",
        ] {
            assert!(parse_trace_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn filters_keep_exactly_the_matching_samples() {
        let p = otel_thread_ctx_profiler::model::fixtures::profile();
        let keep = |f: Filter| {
            let mut q = p.clone();
            let counts = f.apply(&mut q);
            (counts, q)
        };
        // Everything: 5 samples.
        let ((before, after), _) = keep(Filter::default());
        assert_eq!((before, after), (5, 5));
        // Span 7's samples serve /a: two on CPU, one wait.
        let ((_, n), q) = keep(Filter {
            endpoints: vec!["/a".into()],
            ..Default::default()
        });
        assert_eq!(n, 3);
        assert!(q
            .entries
            .iter()
            .all(|e| e.endpoint().as_deref() == Some("/a")));
        // Only the on-CPU samples carry the span's name.
        let ((_, n), _) = keep(Filter {
            span_names: vec!["sort".into()],
            ..Default::default()
        });
        assert_eq!(n, 2);
        let ((_, n), _) = keep(Filter {
            trace_ids: vec![[7; 16]],
            ..Default::default()
        });
        assert_eq!(n, 3);
        // Options combine: each must match.
        let ((_, n), _) = keep(Filter {
            endpoints: vec!["/a".into()],
            trace_ids: vec![[8; 16]],
            ..Default::default()
        });
        assert_eq!(n, 0);
        // Values of one option: any may match.
        let ((_, n), _) = keep(Filter {
            endpoints: vec!["/b".into(), "/a".into()],
            span_names: vec!["sort".into()],
            ..Default::default()
        });
        assert_eq!(n, 2);
    }

    #[test]
    fn the_endpoint_matches_with_or_without_its_method() {
        let attrs = [("http.route", "/sort"), ("http.request.method", "GET")];
        let get = |k: &str| attrs.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        let f = |e: &str| Filter {
            endpoints: vec![e.into()],
            ..Default::default()
        };
        assert!(f("GET /sort").matches(Some([1; 16]), get));
        assert!(f("/sort").matches(Some([1; 16]), get));
        assert!(!f("POST /sort").matches(Some([1; 16]), get));
        assert!(!f("/sort").matches(None, get));
        assert!(Filter::default().matches(None, get));
    }
}
