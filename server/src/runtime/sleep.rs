//! Putting an engine to sleep and waking it (vLLM's and SGLang's sleep endpoints), for the supervisor, and
//! what it keeps on its GPUs asleep, measured: from the simulated driver or NVML, by its processes. The
//! fleet decides who sleeps; this carries it out, in the order the conductor gives (a sleep frees memory
//! before a wake or a start beside it takes it).

use super::engines::{Control, Shared, Slept};
use super::spec::{EngineSpec, Host, SleepApi};
use super::Settings;
use placement::{Bytes, GpuRef};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{timeout, Instant};

/// How long a sleep may take: its weights copied to host memory, at least a few GB/s.
const SLEEP_WITHIN: Duration = Duration::from_secs(120);

impl Shared {
    /// Puts `unit`'s engine to sleep (or wakes it, where `asleep` is false), through its supervisor, and
    /// waits for what came of it; its registered spec says so once done.
    pub(super) async fn sleep_or_wake(&self, unit: &str, asleep: bool) -> Result<(), String> {
        let control = {
            let units = self.lock();
            let found = units.get(unit).ok_or("it is not running")?;
            found
                .control
                .clone()
                .ok_or("Tessera has no agent where it runs")?
        };
        let (reply, outcome) = oneshot::channel();
        let message = if asleep {
            Control::Sleep(reply)
        } else {
            Control::Wake(reply)
        };
        control
            .send(message)
            .await
            .map_err(|_| "its supervisor has ended".to_owned())?;
        let outcome = outcome
            .await
            .unwrap_or_else(|_| Err("its supervisor ended first".to_owned()));
        // A wake that failed starts the engine again, awake.
        if outcome.is_ok() || !asleep {
            self.lock().mark_asleep(unit, asleep);
        }
        outcome
    }
}

/// Puts the engine at `host:port` to sleep by `api`, once its requests in flight are done (the
/// supervisor drained it): what it keeps on its GPUs then, and what the sleep freed, where that can be
/// measured. One found asleep already (adopted after Tessera's restart, where vLLM can say) is not asked
/// again, and what its sleep freed is not known.
pub(super) async fn fall_asleep(
    settings: &Settings,
    spec: &EngineSpec,
    api: SleepApi,
    pid: Option<u32>,
    (host, port, key): (&str, u16, Option<&str>),
) -> Result<Slept, String> {
    let already = api == SleepApi::Vllm && is_sleeping(host, port, key).await == Some(true);
    let before = match already {
        true => None,
        false => held(settings, spec, pid).await,
    };
    if !already {
        post(host, port, key, api.sleep_path(), SLEEP_WITHIN).await?;
    }
    let after = held(settings, spec, pid).await;
    let total = |each: &Vec<Bytes>| each.iter().copied().sum::<Bytes>();
    Ok(Slept {
        kept: after.as_ref().and_then(|each| each.iter().copied().max()),
        freed: before
            .zip(after)
            .map(|(before, after)| total(&before).saturating_sub(total(&after))),
    })
}

/// vLLM's `GET /is_sleeping`: whether it sleeps, where it says.
pub(super) async fn is_sleeping(host: &str, port: u16, key: Option<&str>) -> Option<bool> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;
    let asked = async {
        let stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(connection);
        let mut request = hyper::Request::get("/is_sleeping")
            .header(hyper::header::HOST, format!("{host}:{port}"));
        if let Some(key) = key {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = request.body(Empty::<axum::body::Bytes>::new()).ok()?;
        let answer = sender.send_request(request).await.ok()?;
        let body = answer.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()?
            .get("is_sleeping")?
            .as_bool()
    };
    timeout(Duration::from_secs(5), asked).await.ok().flatten()
}

/// Wakes the engine at `host:port` by `api`, giving it up to `within`: how long the wake took.
pub(super) async fn wake(
    api: SleepApi,
    (host, port, key): (&str, u16, Option<&str>),
    within: Duration,
) -> Result<Duration, String> {
    let began = Instant::now();
    post(host, port, key, api.wake_path(), within).await?;
    Ok(began.elapsed())
}

/// `POST path` on the engine, with its key where it has one: a 2xx within `within`, else why not.
async fn post(
    host: &str,
    port: u16,
    key: Option<&str>,
    path: &str,
    within: Duration,
) -> Result<(), String> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    let asked = async {
        let stream = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("could not reach it: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("could not reach it: {e}"))?;
        tokio::spawn(connection);
        let mut request = hyper::Request::post(path)
            .header(hyper::header::HOST, format!("{host}:{port}"))
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(key) = key {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        // SGLang reads a body (`{}`: every kind of memory); vLLM reads none.
        let request = request
            .body(Full::new(axum::body::Bytes::from_static(b"{}")))
            .map_err(|e| e.to_string())?;
        let answer = sender
            .send_request(request)
            .await
            .map_err(|e| format!("it did not answer: {e}"))?;
        let status = answer.status();
        if status.is_success() {
            return Ok(());
        }
        let body = answer
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let said: String = String::from_utf8_lossy(&body).chars().take(300).collect();
        Err(format!("POST {path} answered {status}: {said}"))
    };
    timeout(within, asked)
        .await
        .unwrap_or_else(|_| Err(format!("POST {path} had no answer within {within:?}")))
}

/// What an engine found asleep keeps on its GPUs (what its sleep freed is not known).
pub(super) async fn measure(settings: &Settings, spec: &EngineSpec, pid: Option<u32>) -> Slept {
    Slept {
        kept: held(settings, spec, pid)
            .await
            .and_then(|each| each.into_iter().max()),
        freed: None,
    }
}

/// What the engine's processes (those of its process group, led by `pid`) hold on each of its GPUs, as
/// the simulated driver or NVML reads it; none where it cannot be read (a cluster's node, where Ray gives
/// no PIDs).
pub(super) async fn held(
    settings: &Settings,
    spec: &EngineSpec,
    pid: Option<u32>,
) -> Option<Vec<Bytes>> {
    use super::process::{group_members, off_executor};
    let pid = pid?;
    let (machine, gpus) = (spec.machine.clone(), spec.gpus.clone());
    match &spec.host {
        Host::Simulated => {
            let sim = crate::inventory::simulated::SimulatedGpus::open(settings.sim_dir.as_ref()?);
            off_executor(move || {
                let ours = group_members(pid);
                gpus.iter()
                    .map(|i| {
                        let now = sim.read(&GpuRef::new(&machine, *i)).ok()?;
                        Some(
                            now.processes
                                .iter()
                                .filter(|(p, _)| ours.contains(p))
                                .map(|(_, b)| *b)
                                .sum::<Bytes>(),
                        )
                    })
                    .collect::<Option<Vec<Bytes>>>()
            })
            .await
        }
        Host::Local => {
            let reader = settings.gpus.clone()?;
            off_executor(move || {
                let ours = group_members(pid);
                gpus.iter()
                    .map(|i| reader.held_by(*i, &ours))
                    .collect::<Option<Vec<Bytes>>>()
            })
            .await
        }
        Host::Remote | Host::Cluster { .. } => None,
    }
}
