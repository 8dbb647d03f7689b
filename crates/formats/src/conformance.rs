//! Checks an OTLP `ProfilesData` against the rules of the profiling SIG's
//! conformance checker (`profcheck`), written from the rules in
//! `profiles.proto`'s comments:
//!
//! - entry 0 of every dictionary table is that table's zero value (no field
//!   set: the empty string, the empty Link, ...), and every table has it;
//! - every index points into its table;
//! - no table holds the same entry twice, and every entry past 0 is
//!   referenced from somewhere;
//! - a Link past entry 0 has a 16-byte trace id and an 8-byte span id, not
//!   all zeros;
//! - samples have a consistent shape: values and timestamps of the same
//!   length when both are present, one of them at least;
//! - every timestamp lies within its profile's `[time, time + duration]`.

use std::collections::HashMap;

use otel_thread_ctx_otlp::profiles::{ProfilesData, ProfilesDictionary};
use otel_thread_ctx_otlp::Message;

/// The tables of the dictionary, in the order violations name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Table {
    Mapping,
    Location,
    Function,
    Link,
    String,
    Attribute,
    Stack,
}

impl Table {
    const ALL: [Table; 7] = [
        Table::Mapping,
        Table::Location,
        Table::Function,
        Table::Link,
        Table::String,
        Table::Attribute,
        Table::Stack,
    ];

    fn name(self) -> &'static str {
        match self {
            Table::Mapping => "mapping_table",
            Table::Location => "location_table",
            Table::Function => "function_table",
            Table::Link => "link_table",
            Table::String => "string_table",
            Table::Attribute => "attribute_table",
            Table::Stack => "stack_table",
        }
    }

    /// Each entry's encoding (equal entries encode equally: prost writes
    /// fields in order and omits default values).
    fn entries(self, d: &ProfilesDictionary) -> Vec<Vec<u8>> {
        fn enc<M: Message>(v: &[M]) -> Vec<Vec<u8>> {
            v.iter().map(Message::encode_to_vec).collect()
        }
        match self {
            Table::Mapping => enc(&d.mapping_table),
            Table::Location => enc(&d.location_table),
            Table::Function => enc(&d.function_table),
            Table::Link => enc(&d.link_table),
            Table::String => d
                .string_table
                .iter()
                .map(|s| s.as_bytes().to_vec())
                .collect(),
            Table::Attribute => enc(&d.attribute_table),
            Table::Stack => enc(&d.stack_table),
        }
    }
}

/// Marks references and reports the ones out of range.
struct References<'a> {
    sizes: HashMap<Table, usize>,
    used: HashMap<Table, Vec<bool>>,
    violations: &'a mut Vec<String>,
}

impl References<'_> {
    fn mark(&mut self, table: Table, index: i32, from: &dyn Fn() -> String) {
        let size = self.sizes[&table];
        if index < 0 || index as usize >= size {
            self.violations.push(format!(
                "{}: index {index} is outside {} (size {size})",
                from(),
                table.name()
            ));
            return;
        }
        self.used.get_mut(&table).expect("every table")[index as usize] = true;
    }
}

/// Every rule the data breaks, one line each; empty when it conforms.
pub fn check(data: &ProfilesData) -> Vec<String> {
    let mut violations = Vec::new();
    let Some(d) = &data.dictionary else {
        if data.resource_profiles.is_empty() {
            return violations;
        }
        violations.push("the data has profiles but no dictionary".into());
        return violations;
    };
    for table in Table::ALL {
        let entries = table.entries(d);
        match entries.first() {
            None => violations.push(format!(
                "{} is empty: entry 0 must be its zero value",
                table.name()
            )),
            Some(zero) if !zero.is_empty() => violations.push(format!(
                "{}[0] is not the zero value (it encodes to {} bytes)",
                table.name(),
                zero.len()
            )),
            Some(_) => {}
        }
        let mut seen: HashMap<&[u8], usize> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            if let Some(first) = seen.insert(e, i) {
                violations.push(format!(
                    "{}[{i}] duplicates {}[{first}]",
                    table.name(),
                    table.name()
                ));
            }
        }
    }
    for (i, link) in d.link_table.iter().enumerate().skip(1) {
        if link.trace_id.len() != 16 || link.trace_id.iter().all(|&b| b == 0) {
            violations.push(format!(
                "link_table[{i}]: trace_id is not 16 bytes, not all zero"
            ));
        }
        if link.span_id.len() != 8 || link.span_id.iter().all(|&b| b == 0) {
            violations.push(format!(
                "link_table[{i}]: span_id is not 8 bytes, not all zero"
            ));
        }
    }
    let sizes: HashMap<Table, usize> = Table::ALL
        .iter()
        .map(|&t| (t, t.entries(d).len()))
        .collect();
    let used = sizes.iter().map(|(&t, &n)| (t, vec![false; n])).collect();
    let mut refs = References {
        sizes,
        used,
        violations: &mut violations,
    };
    for (i, m) in d.mapping_table.iter().enumerate() {
        refs.mark(Table::String, m.filename_strindex, &|| {
            format!("mapping_table[{i}].filename_strindex")
        });
        for &a in &m.attribute_indices {
            refs.mark(Table::Attribute, a, &|| {
                format!("mapping_table[{i}].attribute_indices")
            });
        }
    }
    for (i, l) in d.location_table.iter().enumerate() {
        refs.mark(Table::Mapping, l.mapping_index, &|| {
            format!("location_table[{i}].mapping_index")
        });
        for line in &l.lines {
            refs.mark(Table::Function, line.function_index, &|| {
                format!("location_table[{i}].lines.function_index")
            });
        }
        for &a in &l.attribute_indices {
            refs.mark(Table::Attribute, a, &|| {
                format!("location_table[{i}].attribute_indices")
            });
        }
    }
    for (i, f) in d.function_table.iter().enumerate() {
        for s in [f.name_strindex, f.system_name_strindex, f.filename_strindex] {
            refs.mark(Table::String, s, &|| format!("function_table[{i}]"));
        }
    }
    for (i, a) in d.attribute_table.iter().enumerate() {
        refs.mark(Table::String, a.key_strindex, &|| {
            format!("attribute_table[{i}].key_strindex")
        });
        refs.mark(Table::String, a.unit_strindex, &|| {
            format!("attribute_table[{i}].unit_strindex")
        });
    }
    for (i, s) in d.stack_table.iter().enumerate() {
        for &l in &s.location_indices {
            refs.mark(Table::Location, l, &|| {
                format!("stack_table[{i}].location_indices")
            });
        }
    }
    for (r, rp) in data.resource_profiles.iter().enumerate() {
        for (s, sp) in rp.scope_profiles.iter().enumerate() {
            for (p, profile) in sp.profiles.iter().enumerate() {
                let at = format!("resource_profiles[{r}].scope_profiles[{s}].profiles[{p}]");
                match &profile.sample_type {
                    Some(t) => {
                        refs.mark(Table::String, t.type_strindex, &|| {
                            format!("{at}.sample_type")
                        });
                        refs.mark(Table::String, t.unit_strindex, &|| {
                            format!("{at}.sample_type")
                        });
                    }
                    None => refs.violations.push(format!("{at}: no sample_type")),
                }
                if let Some(t) = &profile.period_type {
                    refs.mark(Table::String, t.type_strindex, &|| {
                        format!("{at}.period_type")
                    });
                    refs.mark(Table::String, t.unit_strindex, &|| {
                        format!("{at}.period_type")
                    });
                }
                for &a in &profile.attribute_indices {
                    refs.mark(Table::Attribute, a, &|| format!("{at}.attribute_indices"));
                }
                let end = profile.time_unix_nano.saturating_add(profile.duration_nano);
                for (k, sample) in profile.samples.iter().enumerate() {
                    let here = || format!("{at}.samples[{k}]");
                    refs.mark(Table::Stack, sample.stack_index, &here);
                    refs.mark(Table::Link, sample.link_index, &here);
                    for &a in &sample.attribute_indices {
                        refs.mark(Table::Attribute, a, &here);
                    }
                    let (values, times) = (sample.values.len(), sample.timestamps_unix_nano.len());
                    if values == 0 && times == 0 {
                        refs.violations
                            .push(format!("{}: neither values nor timestamps", here()));
                    }
                    if values > 0 && times > 0 && values != times {
                        refs.violations.push(format!(
                            "{}: {} but {}",
                            here(),
                            crate::count(values as u64, "value", "values"),
                            crate::count(times as u64, "timestamp", "timestamps")
                        ));
                    }
                    for &t in &sample.timestamps_unix_nano {
                        if t < profile.time_unix_nano || t > end {
                            refs.violations.push(format!(
                                "{}: timestamp {t} outside the profile's [{}, {end}]",
                                here(),
                                profile.time_unix_nano
                            ));
                        }
                    }
                }
            }
        }
    }
    let References { used, .. } = refs;
    for table in Table::ALL {
        for (i, &u) in used[&table].iter().enumerate().skip(1) {
            if !u {
                violations.push(format!("{}[{i}] is never referenced", table.name()));
            }
        }
    }
    violations
}

/// Reads a `ProfilesData` protobuf file and checks it.
pub fn check_file(path: &std::path::Path) -> Result<Vec<String>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let data = ProfilesData::decode(&bytes[..])
        .map_err(|e| format!("not an OTLP ProfilesData protobuf: {e}"))?;
    Ok(check(&data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_thread_ctx_otlp::profiles::{Link, Sample, Stack};
    use otel_thread_ctx_otlp::{AnyValue, KeyValue, Resource};

    fn good() -> ProfilesData {
        let mut p = otel_thread_ctx_profiler::model::fixtures::profile();
        // The samples' times (1 µs) lie within the profile.
        p.duration_ns = 1_000_000;
        let resource = Resource {
            attributes: vec![KeyValue::new("service.name", AnyValue::string("svc"))],
            dropped_attributes_count: 0,
        };
        crate::otlp::data(crate::otlp::request(&p, resource, None))
    }

    fn first_sample(d: &mut ProfilesData) -> &mut Sample {
        &mut d.resource_profiles[0].scope_profiles[0].profiles[0].samples[0]
    }

    #[test]
    fn the_writers_profiles_conform() {
        assert_eq!(check(&good()), Vec::<String>::new());
    }

    #[test]
    fn entry_zero_must_be_the_zero_value() {
        let mut d = good();
        d.dictionary.as_mut().unwrap().link_table[0] = Link {
            trace_id: vec![0; 16],
            span_id: vec![0; 8],
        };
        let v = check(&d);
        assert!(
            v.iter()
                .any(|l| l.starts_with("link_table[0] is not the zero value")),
            "{v:?}"
        );
        let mut d = good();
        d.dictionary.as_mut().unwrap().string_table[0] = "x".into();
        assert!(check(&d).iter().any(|l| l.starts_with("string_table[0]")));
        let mut d = good();
        d.dictionary.as_mut().unwrap().mapping_table.clear();
        assert!(check(&d)
            .iter()
            .any(|l| l == "mapping_table is empty: entry 0 must be its zero value"));
    }

    #[test]
    fn duplicates_and_unreferenced_entries_are_reported() {
        let mut d = good();
        let dict = d.dictionary.as_mut().unwrap();
        let copy = dict.stack_table[1].clone();
        dict.stack_table.push(copy);
        let n = dict.stack_table.len() - 1;
        let v = check(&d);
        assert!(
            v.contains(&format!("stack_table[{n}] duplicates stack_table[1]")),
            "{v:?}"
        );
        assert!(
            v.contains(&format!("stack_table[{n}] is never referenced")),
            "{v:?}"
        );
        let mut d = good();
        d.dictionary
            .as_mut()
            .unwrap()
            .string_table
            .push("orphan".into());
        assert!(check(&d).iter().any(|l| l.ends_with("is never referenced")));
    }

    #[test]
    fn indexes_must_point_into_their_tables() {
        let mut d = good();
        first_sample(&mut d).link_index = 999;
        let v = check(&d);
        assert!(
            v.iter()
                .any(|l| l.contains("index 999 is outside link_table")),
            "{v:?}"
        );
        let mut d = good();
        d.dictionary.as_mut().unwrap().stack_table.push(Stack {
            location_indices: vec![-1],
        });
        assert!(check(&d)
            .iter()
            .any(|l| l.contains("index -1 is outside location_table")));
    }

    #[test]
    fn links_carry_whole_nonzero_ids() {
        let mut d = good();
        let dict = d.dictionary.as_mut().unwrap();
        let i = dict.link_table.len() as i32;
        dict.link_table.push(Link {
            trace_id: vec![1; 15],
            span_id: vec![0; 8],
        });
        first_sample(&mut d).link_index = i;
        let v = check(&d);
        assert!(
            v.iter().any(|l| l.contains("trace_id is not 16 bytes")),
            "{v:?}"
        );
        assert!(
            v.iter().any(|l| l.contains("span_id is not 8 bytes")),
            "{v:?}"
        );
    }

    #[test]
    fn sample_shapes_and_times_are_checked() {
        let mut d = good();
        first_sample(&mut d).values.push(1);
        let v = check(&d);
        assert!(
            v.iter().any(|l| l.ends_with("3 values but 2 timestamps")),
            "{v:?}"
        );
        let mut d = good();
        let s = first_sample(&mut d);
        s.values.clear();
        s.timestamps_unix_nano.clear();
        assert!(check(&d)
            .iter()
            .any(|l| l.ends_with("neither values nor timestamps")));
        let mut d = good();
        let p = &d.resource_profiles[0].scope_profiles[0].profiles[0];
        let end = p.time_unix_nano + p.duration_nano;
        first_sample(&mut d).timestamps_unix_nano[0] = end + 1;
        assert!(check(&d)
            .iter()
            .any(|l| l.contains("outside the profile's")));
    }
}
