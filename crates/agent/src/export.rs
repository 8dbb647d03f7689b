//! Sends exports to an OTLP receiver (an OpenTelemetry Collector, or any
//! backend that takes OTLP profiles) on a thread of its own: OTLP/gRPC with
//! tonic, OTLP/HTTP (protobuf) with hyper. Each request has a timeout; a
//! failure the receiver may recover from is retried with exponential
//! backoff; exports waiting meanwhile sit in a bounded queue that drops the
//! oldest. Sampling never waits for any of it. At shutdown the exporter
//! is given a deadline: what is not sent by then (in flight, being retried
//! or queued) is counted as unsent and the exporter stops.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use otel_thread_ctx_otlp::profiles::{ExportProfilesServiceRequest, ExportProfilesServiceResponse};
use otel_thread_ctx_otlp::Message;
use tonic::transport::Channel;

use crate::queue::Queue;

/// How exports reach the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// OTLP/gRPC (the Collector's port 4317).
    Grpc,
    /// OTLP/HTTP with a protobuf body (the Collector's port 4318).
    Http,
}

/// A receiver, as `--otlp-endpoint` (and `--otlp-protocol`) name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub protocol: Protocol,
    /// gRPC: `http://host:port`; HTTP: the whole URL of the profiles path.
    pub url: String,
}

/// The OTLP/HTTP path of profiles (the Collector's otlpreceiver serves it).
pub const HTTP_PROFILES_PATH: &str = "/v1development/profiles";

/// The gRPC method of the profiles service.
const GRPC_EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// Reads `--otlp-endpoint`: `grpc://host:port` or `http://host:port[/path]`;
/// the scheme chooses the protocol unless `protocol` overrides it.
pub fn parse_endpoint(url: &str, protocol: Option<Protocol>) -> Result<Endpoint, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        format!("--otlp-endpoint {url:?}: expected grpc://host:port or http://host:port")
    })?;
    let from_scheme = match scheme {
        "grpc" => Protocol::Grpc,
        "http" => Protocol::Http,
        "https" => return Err(format!("--otlp-endpoint {url:?}: TLS is not supported; send to a local Collector over plain grpc:// or http://")),
        other => return Err(format!("--otlp-endpoint {url:?}: unknown scheme {other:?} (grpc:// or http://)")),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(format!("--otlp-endpoint {url:?} names no host"));
    }
    let protocol = protocol.unwrap_or(from_scheme);
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.contains(']'));
    let default_port = match protocol {
        Protocol::Grpc => 4317,
        Protocol::Http => 4318,
    };
    let authority = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:{default_port}")
    };
    let url = match protocol {
        Protocol::Grpc => format!("http://{authority}"),
        Protocol::Http if path.len() > 1 => format!("http://{authority}{path}"),
        Protocol::Http => format!("http://{authority}{HTTP_PROFILES_PATH}"),
    };
    Ok(Endpoint { protocol, url })
}

/// The OpenTelemetry exporter environment variables read when no
/// `--otlp-endpoint` is given: the profiles signal's own first, then the
/// generic ones.
pub const ENV_PROFILES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT";
pub const ENV_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const ENV_PROFILES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL";
pub const ENV_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";

/// The receiver the exporter environment variables name, as the
/// OpenTelemetry exporter specification reads them; `Ok(None)` when neither
/// endpoint variable is set (an empty value counts as unset). `var` reads
/// one variable; `protocol` (`--otlp-protocol`) overrides the protocol
/// variables.
///
/// - The protocol: `--otlp-protocol`, else the profiles protocol variable,
///   else the generic one (`grpc` or `http/protobuf`; `http/json` is not
///   supported), else `http/protobuf` (the specification's default), or
///   `grpc` for a `grpc://` URL (this agent's own scheme, as for the flag).
/// - OTLP/HTTP: the profiles endpoint is the whole URL, used as is (`/` when
///   it has no path); the generic one is a base URL to which
///   `v1development/profiles` is appended.
/// - OTLP/gRPC: either names the receiver's host and port; a path is
///   ignored.
/// - A URL without a port means port 80, as URLs do (`grpc://` URLs: 4317).
///   `https` is refused: TLS is not supported.
pub fn endpoint_from_env(
    var: impl Fn(&str) -> Option<String>,
    protocol: Option<Protocol>,
) -> Result<Option<Endpoint>, String> {
    let get = |name: &str| {
        var(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let (name, url, per_signal) = if let Some(url) = get(ENV_PROFILES_ENDPOINT) {
        (ENV_PROFILES_ENDPOINT, url, true)
    } else if let Some(url) = get(ENV_ENDPOINT) {
        (ENV_ENDPOINT, url, false)
    } else {
        return Ok(None);
    };
    let from_variable = match [ENV_PROFILES_PROTOCOL, ENV_PROTOCOL]
        .into_iter()
        .find_map(|n| get(n).map(|v| (n, v)))
    {
        None => None,
        Some((_, v)) if v == "grpc" => Some(Protocol::Grpc),
        Some((_, v)) if v == "http/protobuf" => Some(Protocol::Http),
        Some((n, v)) if v == "http/json" => {
            return Err(format!(
                "{n}={v}: OTLP/HTTP with JSON bodies is not supported (grpc or http/protobuf)"
            ))
        }
        Some((n, v)) => {
            return Err(format!(
                "{n}={v:?}: unknown protocol (grpc or http/protobuf)"
            ))
        }
    };
    let bad = |why: &str| format!("{name}={url:?}: {why}");
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("expected a URL such as http://host:4318"))?;
    let grpc_scheme = match scheme {
        "http" => false,
        "grpc" => true,
        "https" => {
            return Err(bad(
                "TLS is not supported; send to a local Collector over plain http://",
            ))
        }
        _ => return Err(bad("unknown scheme (http://)")),
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    // Query and fragment are not part of where requests go.
    let path = path.split(['?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err(bad("names no host"));
    }
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.contains(']'));
    let authority = match (has_port, grpc_scheme) {
        (true, _) => authority.to_string(),
        (false, true) => format!("{authority}:4317"),
        (false, false) => format!("{authority}:80"),
    };
    let protocol = protocol.or(from_variable).unwrap_or(if grpc_scheme {
        Protocol::Grpc
    } else {
        Protocol::Http
    });
    let url = match protocol {
        Protocol::Grpc => format!("http://{authority}"),
        Protocol::Http if per_signal && path.is_empty() => format!("http://{authority}/"),
        Protocol::Http if per_signal => format!("http://{authority}{path}"),
        Protocol::Http => {
            let base = path.strip_suffix('/').unwrap_or(path);
            format!("http://{authority}{base}{HTTP_PROFILES_PATH}")
        }
    };
    Ok(Some(Endpoint { protocol, url }))
}

/// Counts the exporter keeps (read by the agent's summary and log).
#[derive(Debug, Default)]
pub struct Stats {
    pub sent: AtomicU64,
    pub failed_attempts: AtomicU64,
    /// Exports given up after their retries, or refused for good.
    pub abandoned: AtomicU64,
    /// Exports in flight, being retried or queued when the shutdown
    /// deadline passed.
    pub unsent: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

/// A failed attempt, and whether trying again may help.
struct Failure {
    text: String,
    retryable: bool,
}

/// Timeout of one attempt.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Backoff after the first failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long one export is retried before it is given up.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// How long [`Exporter::finish`] waits past the deadline for the exporter's
/// thread to notice it (it stops within a few milliseconds of it).
const JOIN_SLACK: Duration = Duration::from_millis(200);

/// The exporter thread and its queue.
pub struct Exporter {
    pub queue: Arc<Queue<ExportProfilesServiceRequest>>,
    pub stats: Arc<Stats>,
    /// The shutdown deadline, once there is one.
    deadline: tokio::sync::watch::Sender<Option<Instant>>,
    thread: Option<JoinHandle<()>>,
}

impl Exporter {
    pub fn start(endpoint: Endpoint, capacity: usize) -> std::io::Result<Exporter> {
        let queue = Arc::new(Queue::new(capacity));
        let stats = Arc::new(Stats::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (deadline, deadline_rx) = tokio::sync::watch::channel(None);
        let thread = {
            let (queue, stats) = (queue.clone(), stats.clone());
            std::thread::Builder::new()
                .name("otlp-export".into())
                .spawn(move || {
                    runtime.block_on(run(endpoint, queue, stats, deadline_rx));
                    // Nothing left to wait for: a name resolution still
                    // running on the blocking pool is not waited for.
                    runtime.shutdown_background();
                })?
        };
        Ok(Exporter {
            queue,
            stats,
            deadline,
            thread: Some(thread),
        })
    }

    /// Sends what is queued until `deadline`, then stops: what is not sent
    /// by then is counted in [`Stats::unsent`]. Returns `false` when the
    /// exporter's thread had not stopped shortly after the deadline (it is
    /// left behind; the counts may then miss the exports it held).
    pub fn finish(mut self, deadline: Instant) -> bool {
        self.deadline.send_replace(Some(deadline));
        self.queue.close();
        let Some(t) = self.thread.take() else {
            return true;
        };
        while !t.is_finished() {
            if Instant::now() >= deadline + JOIN_SLACK {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = t.join();
        true
    }
}

/// Resolves once a shutdown deadline was set and has passed.
async fn deadline_passed(mut deadline: tokio::sync::watch::Receiver<Option<Instant>>) {
    let at = loop {
        if let Some(at) = *deadline.borrow_and_update() {
            break at;
        }
        if deadline.changed().await.is_err() {
            // The exporter was dropped without a deadline: none comes.
            std::future::pending::<()>().await;
        }
    };
    tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
}

/// The connections, made once and reused (both reconnect on their own).
enum Connection {
    Grpc(Channel),
    Http(Client<HttpConnector, Full<Bytes>>, String),
}

async fn run(
    endpoint: Endpoint,
    queue: Arc<Queue<ExportProfilesServiceRequest>>,
    stats: Arc<Stats>,
    deadline: tokio::sync::watch::Receiver<Option<Instant>>,
) {
    let client = match endpoint.protocol {
        Protocol::Grpc => match tonic::transport::Endpoint::from_shared(endpoint.url.clone()) {
            Ok(e) => Connection::Grpc(
                e.connect_timeout(ATTEMPT_TIMEOUT)
                    .timeout(ATTEMPT_TIMEOUT)
                    .connect_lazy(),
            ),
            Err(e) => {
                *stats.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(format!("{}: {e}", endpoint.url));
                return;
            }
        },
        Protocol::Http => {
            let mut connector = HttpConnector::new();
            connector.set_connect_timeout(Some(ATTEMPT_TIMEOUT));
            Connection::Http(
                Client::builder(TokioExecutor::new()).build(connector),
                endpoint.url.clone(),
            )
        }
    };
    loop {
        if deadline.borrow().is_some_and(|at| Instant::now() >= at) {
            count_unsent(&queue, &stats, 0);
            return;
        }
        // Waited for off the runtime's thread: the connections' tasks keep
        // running meanwhile.
        let waiting = queue.clone();
        let item = tokio::task::spawn_blocking(move || waiting.pop(Duration::from_millis(500)))
            .await
            .ok()
            .flatten();
        let Some(request) = item else {
            if queue.is_closed() && queue.is_empty() {
                return;
            }
            continue;
        };
        if !before_deadline(send(&client, &request, &stats), deadline.clone()).await {
            count_unsent(&queue, &stats, 1);
            return;
        }
    }
}

/// Runs `work` to its end, or until the shutdown deadline passes (it is then
/// dropped, cancelling an attempt in flight): `false` in the latter case.
async fn before_deadline(
    work: impl std::future::Future<Output = ()>,
    deadline: tokio::sync::watch::Receiver<Option<Instant>>,
) -> bool {
    use std::future::Future;
    use std::task::Poll;
    let mut work = std::pin::pin!(work);
    let mut passed = std::pin::pin!(deadline_passed(deadline));
    std::future::poll_fn(|cx| {
        if work.as_mut().poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        if passed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(false);
        }
        Poll::Pending
    })
    .await
}

/// At the deadline: `in_hand` exports being sent, and every one queued, are
/// not sent.
fn count_unsent(queue: &Queue<ExportProfilesServiceRequest>, stats: &Stats, in_hand: u64) {
    let mut unsent = in_hand;
    while queue.pop(Duration::ZERO).is_some() {
        unsent += 1;
    }
    stats.unsent.fetch_add(unsent, Ordering::Relaxed);
}

/// Sends one export, retrying with backoff what may succeed later, until it
/// is sent or given up.
async fn send(client: &Connection, request: &ExportProfilesServiceRequest, stats: &Stats) {
    let first = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    loop {
        match attempt(client, request).await {
            Ok(()) => {
                stats.sent.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(f) => {
                stats.failed_attempts.fetch_add(1, Ordering::Relaxed);
                *stats.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(f.text);
                if !f.retryable || first.elapsed() >= RETRY_FOR {
                    stats.abandoned.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

async fn attempt(
    client: &Connection,
    request: &ExportProfilesServiceRequest,
) -> Result<(), Failure> {
    match client {
        Connection::Grpc(channel) => grpc_export(channel.clone(), request.clone()).await,
        Connection::Http(client, url) => http_export(client, url, request).await,
    }
}

/// One call of `ProfilesService/Export` (the client is this one method,
/// declared here rather than generated).
async fn grpc_export(
    channel: Channel,
    request: ExportProfilesServiceRequest,
) -> Result<(), Failure> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| Failure {
        text: format!("gRPC channel: {e}"),
        retryable: true,
    })?;
    let codec: tonic_prost::ProstCodec<
        ExportProfilesServiceRequest,
        ExportProfilesServiceResponse,
    > = tonic_prost::ProstCodec::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(GRPC_EXPORT_PATH);
    match grpc.unary(tonic::Request::new(request), path, codec).await {
        Ok(response) => partial_success(response.into_inner()),
        Err(status) => {
            use tonic::Code;
            let retryable = matches!(
                status.code(),
                Code::Unavailable
                    | Code::ResourceExhausted
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::Cancelled
                    | Code::OutOfRange
                    | Code::DataLoss
                    | Code::Unknown
            );
            Err(Failure {
                text: format!("gRPC {:?}: {}", status.code(), status.message()),
                retryable,
            })
        }
    }
}

/// A receiver that accepted the request but rejected profiles in it: not
/// worth sending again.
fn partial_success(r: ExportProfilesServiceResponse) -> Result<(), Failure> {
    match r.partial_success {
        Some(p) if p.rejected_profiles > 0 => Err(Failure {
            text: format!(
                "the receiver rejected {}: {}",
                otel_thread_ctx_formats::count(
                    p.rejected_profiles.max(0) as u64,
                    "profile",
                    "profiles"
                ),
                p.error_message
            ),
            retryable: false,
        }),
        _ => Ok(()),
    }
}

async fn http_export(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    request: &ExportProfilesServiceRequest,
) -> Result<(), Failure> {
    let body = Full::new(Bytes::from(request.encode_to_vec()));
    let req = hyper::Request::post(url)
        .header("content-type", "application/x-protobuf")
        .body(body)
        .map_err(|e| Failure {
            text: format!("{url}: {e}"),
            retryable: false,
        })?;
    let response = match tokio::time::timeout(ATTEMPT_TIMEOUT, client.request(req)).await {
        Err(_) => {
            return Err(Failure {
                text: format!("{url}: no answer within {ATTEMPT_TIMEOUT:?}"),
                retryable: true,
            })
        }
        Ok(Err(e)) => {
            return Err(Failure {
                text: format!("{url}: {e}"),
                retryable: true,
            })
        }
        Ok(Ok(r)) => r,
    };
    let status = response.status();
    let body = tokio::time::timeout(ATTEMPT_TIMEOUT, response.into_body().collect())
        .await
        .ok()
        .and_then(|b| b.ok())
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if status.is_success() {
        return match ExportProfilesServiceResponse::decode(&body[..]) {
            Ok(r) => partial_success(r),
            // An empty or non-protobuf success body: accepted.
            Err(_) => Ok(()),
        };
    }
    Err(Failure {
        text: format!("{url} answered {status}"),
        retryable: matches!(status.as_u16(), 429 | 502 | 503 | 504),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_chooses_the_protocol_and_the_default_port() {
        assert_eq!(
            parse_endpoint("grpc://127.0.0.1:4317", None).unwrap(),
            Endpoint {
                protocol: Protocol::Grpc,
                url: "http://127.0.0.1:4317".into()
            }
        );
        assert_eq!(
            parse_endpoint("http://collector", None).unwrap(),
            Endpoint {
                protocol: Protocol::Http,
                url: "http://collector:4318/v1development/profiles".into()
            }
        );
        assert_eq!(
            parse_endpoint("http://h:1/custom/path", None).unwrap().url,
            "http://h:1/custom/path"
        );
        assert_eq!(
            parse_endpoint("http://h:4317", Some(Protocol::Grpc)).unwrap(),
            Endpoint {
                protocol: Protocol::Grpc,
                url: "http://h:4317".into()
            }
        );
        assert!(parse_endpoint("https://h", None).is_err());
        assert!(parse_endpoint("ftp://h", None).is_err());
        assert!(parse_endpoint("h:4317", None).is_err());
        assert!(parse_endpoint("grpc://", None).is_err());
    }

    /// `endpoint_from_env` with these variables set.
    fn from_env(
        vars: &[(&str, &str)],
        protocol: Option<Protocol>,
    ) -> Result<Option<Endpoint>, String> {
        let vars: std::collections::HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        endpoint_from_env(|name| vars.get(name).cloned(), protocol)
    }

    fn http(url: &str) -> Option<Endpoint> {
        Some(Endpoint {
            protocol: Protocol::Http,
            url: url.into(),
        })
    }

    fn grpc(url: &str) -> Option<Endpoint> {
        Some(Endpoint {
            protocol: Protocol::Grpc,
            url: url.into(),
        })
    }

    #[test]
    fn no_endpoint_variable_no_endpoint() {
        assert_eq!(from_env(&[], None), Ok(None));
        assert_eq!(from_env(&[(ENV_ENDPOINT, " ")], None), Ok(None));
        assert_eq!(from_env(&[(ENV_PROTOCOL, "grpc")], None), Ok(None));
    }

    #[test]
    fn the_generic_endpoint_is_a_base_url_for_http() {
        // http/protobuf is the default.
        assert_eq!(
            from_env(&[(ENV_ENDPOINT, "http://collector:4318")], None),
            Ok(http("http://collector:4318/v1development/profiles"))
        );
        assert_eq!(
            from_env(&[(ENV_ENDPOINT, "http://collector:4318/")], None),
            Ok(http("http://collector:4318/v1development/profiles"))
        );
        assert_eq!(
            from_env(&[(ENV_ENDPOINT, "http://gw:4318/otlp/")], None),
            Ok(http("http://gw:4318/otlp/v1development/profiles"))
        );
        assert_eq!(
            from_env(&[(ENV_ENDPOINT, "http://gw:4318/otlp")], None),
            Ok(http("http://gw:4318/otlp/v1development/profiles"))
        );
        assert_eq!(
            from_env(
                &[
                    (ENV_ENDPOINT, "http://collector"),
                    (ENV_PROTOCOL, "http/protobuf")
                ],
                None
            ),
            Ok(http("http://collector:80/v1development/profiles"))
        );
    }

    #[test]
    fn the_profiles_endpoint_is_used_as_is_and_comes_first() {
        assert_eq!(
            from_env(
                &[
                    (ENV_PROFILES_ENDPOINT, "http://p:4318/custom/profiles"),
                    (ENV_ENDPOINT, "http://other:4318")
                ],
                None
            ),
            Ok(http("http://p:4318/custom/profiles"))
        );
        assert_eq!(
            from_env(&[(ENV_PROFILES_ENDPOINT, "http://p:4318")], None),
            Ok(http("http://p:4318/"))
        );
        // An empty profiles variable is unset.
        assert_eq!(
            from_env(
                &[(ENV_PROFILES_ENDPOINT, ""), (ENV_ENDPOINT, "http://g:1")],
                None
            ),
            Ok(http("http://g:1/v1development/profiles"))
        );
    }

    #[test]
    fn grpc_takes_host_and_port_from_either_variable() {
        assert_eq!(
            from_env(
                &[
                    (ENV_ENDPOINT, "http://10.0.0.7:4317"),
                    (ENV_PROTOCOL, "grpc")
                ],
                None
            ),
            Ok(grpc("http://10.0.0.7:4317"))
        );
        assert_eq!(
            from_env(
                &[
                    (ENV_PROFILES_ENDPOINT, "http://c:4317/ignored"),
                    (ENV_PROFILES_PROTOCOL, "grpc"),
                    (ENV_PROTOCOL, "http/protobuf")
                ],
                None
            ),
            Ok(grpc("http://c:4317"))
        );
        // This agent's grpc:// scheme implies gRPC unless a protocol is named.
        assert_eq!(
            from_env(&[(ENV_ENDPOINT, "grpc://c")], None),
            Ok(grpc("http://c:4317"))
        );
        // --otlp-protocol wins over the variables.
        assert_eq!(
            from_env(
                &[(ENV_ENDPOINT, "http://c:4318"), (ENV_PROTOCOL, "grpc")],
                Some(Protocol::Http)
            ),
            Ok(http("http://c:4318/v1development/profiles"))
        );
        assert_eq!(
            from_env(&[(ENV_ENDPOINT, "http://[::1]:4317")], Some(Protocol::Grpc)),
            Ok(grpc("http://[::1]:4317"))
        );
    }

    #[test]
    fn bad_variables_say_which_and_why() {
        let err = |vars: &[(&str, &str)]| from_env(vars, None).unwrap_err();
        let e = err(&[(ENV_ENDPOINT, "https://c:4318")]);
        assert!(e.contains(ENV_ENDPOINT) && e.contains("TLS"), "{e}");
        let e = err(&[(ENV_PROFILES_ENDPOINT, "c:4318")]);
        assert!(
            e.contains(ENV_PROFILES_ENDPOINT) && e.contains("URL"),
            "{e}"
        );
        let e = err(&[(ENV_ENDPOINT, "http://")]);
        assert!(e.contains("no host"), "{e}");
        let e = err(&[(ENV_ENDPOINT, "http://c"), (ENV_PROTOCOL, "http/json")]);
        assert!(e.contains(ENV_PROTOCOL) && e.contains("JSON"), "{e}");
        let e = err(&[(ENV_ENDPOINT, "http://c"), (ENV_PROFILES_PROTOCOL, "udp")]);
        assert!(
            e.contains(ENV_PROFILES_PROTOCOL) && e.contains("unknown protocol"),
            "{e}"
        );
    }

    #[test]
    fn partial_successes_that_reject_profiles_are_failures() {
        use otel_thread_ctx_otlp::profiles::ExportProfilesPartialSuccess;
        assert!(partial_success(ExportProfilesServiceResponse::default()).is_ok());
        let rejected = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 2,
                error_message: "bad".into(),
            }),
        };
        let f = partial_success(rejected).unwrap_err();
        assert!(!f.retryable && f.text.contains("rejected 2"));
    }

    #[test]
    fn finish_stops_at_the_deadline_and_counts_what_was_not_sent() {
        // A receiver that accepts connections and never answers.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let _held: Vec<_> = listener.incoming().collect();
        });
        let exporter = Exporter::start(parse_endpoint(&url, None).unwrap(), 4).unwrap();
        let stats = exporter.stats.clone();
        exporter.queue.push(ExportProfilesServiceRequest::default());
        exporter.queue.push(ExportProfilesServiceRequest::default());
        assert!(exporter.finish(Instant::now() + Duration::from_millis(300)));
        assert_eq!(stats.sent.load(Ordering::Relaxed), 0);
        assert_eq!(stats.abandoned.load(Ordering::Relaxed), 0);
        assert_eq!(stats.unsent.load(Ordering::Relaxed), 2);
    }
}
