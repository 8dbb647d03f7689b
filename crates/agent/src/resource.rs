//! The Resource of one process's profiles: what its process context
//! (OTEP 4719) publishes, completed with the process attributes the agent
//! sees from outside (OpenTelemetry semantic conventions), never replacing
//! a published value.

use otel_thread_ctx_otlp::{AnyValue, KeyValue, Resource};

/// What the agent knows of a process from /proc.
pub struct Process<'a> {
    pub pid: i32,
    /// `/proc/<pid>/exe`.
    pub executable: &'a str,
    /// The command it was started with (argv[0]).
    pub command: &'a str,
    /// This host's name.
    pub host_name: &'a str,
}

pub fn resource(published: Option<Resource>, p: &Process) -> Resource {
    let mut r = published.unwrap_or(Resource {
        attributes: Vec::new(),
        dropped_attributes_count: 0,
    });
    let executable_name = p.executable.rsplit('/').next().unwrap_or(p.executable);
    let mut add = |key: &str, value: AnyValue| {
        if !r.attributes.iter().any(|kv| kv.key == key) {
            r.attributes.push(KeyValue::new(key, value));
        }
    };
    // What an SDK without a configured name reports.
    add(
        "service.name",
        AnyValue::string(format!("unknown_service:{executable_name}")),
    );
    add("process.pid", AnyValue::int(p.pid as i64));
    add("process.executable.path", AnyValue::string(p.executable));
    add("process.executable.name", AnyValue::string(executable_name));
    if !p.command.is_empty() {
        add("process.command", AnyValue::string(p.command));
    }
    if executable_name == "node"
        || executable_name.starts_with("node-")
        || executable_name.starts_with("nodejs")
    {
        add("process.runtime.name", AnyValue::string("nodejs"));
    }
    if !p.host_name.is_empty() {
        add("host.name", AnyValue::string(p.host_name));
    }
    r
}

/// The `service.name` a published Resource holds (a string value), if any.
pub fn service_name(published: &Resource) -> Option<&str> {
    use otel_thread_ctx_otlp::any_value::Value;
    published
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        })
}

/// This host's name (`uname -n`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(r: &Resource, key: &str) -> Option<String> {
        r.attributes
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| format!("{:?}", kv.value))
    }

    #[test]
    fn published_values_win_and_the_process_fills_the_rest() {
        let published = Resource {
            attributes: vec![KeyValue::new("service.name", AnyValue::string("checkout"))],
            dropped_attributes_count: 0,
        };
        let p = Process {
            pid: 42,
            executable: "/usr/bin/node",
            command: "node",
            host_name: "h1",
        };
        let r = resource(Some(published), &p);
        assert!(value(&r, "service.name").unwrap().contains("checkout"));
        assert!(value(&r, "process.pid").unwrap().contains("42"));
        assert!(value(&r, "process.executable.name")
            .unwrap()
            .contains("\"node\""));
        assert!(value(&r, "process.runtime.name")
            .unwrap()
            .contains("nodejs"));
        assert!(value(&r, "host.name").unwrap().contains("h1"));
        assert_eq!(
            r.attributes
                .iter()
                .filter(|kv| kv.key == "service.name")
                .count(),
            1
        );
    }

    #[test]
    fn the_published_service_name_is_read_as_a_string() {
        let named = Resource {
            attributes: vec![
                KeyValue::new("host.name", AnyValue::string("h1")),
                KeyValue::new("service.name", AnyValue::string("checkout")),
            ],
            dropped_attributes_count: 0,
        };
        assert_eq!(service_name(&named), Some("checkout"));
        let not_a_string = Resource {
            attributes: vec![KeyValue::new("service.name", AnyValue::int(3))],
            dropped_attributes_count: 0,
        };
        assert_eq!(service_name(&not_a_string), None);
        let unnamed = Resource {
            attributes: Vec::new(),
            dropped_attributes_count: 0,
        };
        assert_eq!(service_name(&unnamed), None);
    }

    #[test]
    fn an_unnamed_service_is_named_after_its_executable() {
        let p = Process {
            pid: 1,
            executable: "/opt/app/server",
            command: "server",
            host_name: "",
        };
        let r = resource(None, &p);
        assert!(value(&r, "service.name")
            .unwrap()
            .contains("unknown_service:server"));
        assert!(value(&r, "process.runtime.name").is_none());
        assert!(value(&r, "host.name").is_none());
    }
}
