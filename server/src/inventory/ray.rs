//! A Ray cluster, through its dashboard's REST APIs (plain JSON over HTTP): the nodes that carry Tessera's
//! labels are machines, and engines on them run as jobs (Jobs API). Ray runs the commands; which node, which
//! share and in what order stay Tessera's decisions.
//!
//! What a node tells Tessera (written by `tessera ray-node`, docs/src/ray.md):
//! - the label [`MACHINE_LABEL`]: the machine's name, and that the node is Tessera's;
//! - the label [`MODEL_LABEL`]: its GPUs' model;
//! - the label [`DEMO_LABEL`] `=true` on a node whose GPUs are made up: the demo engine stands in there;
//! - one custom resource per GPU, `tessera_gpu_{index}_{uuid}`, worth the GPU's memory in MiB: a job books
//!   its share there, so that Ray itself refuses two jobs that together overbook a GPU. A GPU cut into MIG
//!   instances is not one: each instance is, numbered as [`placement::mig::instance_index`] says, with the
//!   label [`MIG_LABEL`]`{index}` giving its profile.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes as BodyBytes;
use hyper::Method;
use hyper_util::rt::TokioIo;
use placement::{Bytes, Gpu, Machine};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The label that names a node's machine.
pub const MACHINE_LABEL: &str = "tessera.machine";
/// The label that gives a node's GPU model.
pub const MODEL_LABEL: &str = "tessera.gpu-model";
/// The label of a node whose GPUs are made up (tests, trying Tessera out).
pub const DEMO_LABEL: &str = "tessera.demo";
/// What the label of a MIG instance's profile is named, its index after it: `tessera.mig.5001=3g.40gb`.
pub const MIG_LABEL: &str = "tessera.mig.";
/// What each GPU resource's name begins with.
pub const GPU_RESOURCE: &str = "tessera_gpu_";

const MIB: u64 = 1 << 20;

/// How long one request to the cluster may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the cluster did not answer as it should.
#[derive(Debug, thiserror::Error)]
pub enum RayError {
    /// The address given is not `http://host:port`.
    #[error("the Ray address {0:?} is not http://HOST:PORT (the head node's dashboard, port 8265 by default)")]
    Address(String),
    /// No connection, or no answer in time.
    #[error("the Ray cluster at {address} does not answer: {why}")]
    Unreachable {
        /// The dashboard's address.
        address: String,
        /// What failed.
        why: String,
    },
    /// An answer that is not a success.
    #[error("the Ray cluster answered {status} to {method} {path}: {body}")]
    Status {
        /// The method.
        method: String,
        /// The path.
        path: String,
        /// The status.
        status: u16,
        /// The start of its body.
        body: String,
    },
    /// A body that is not what the API documents.
    #[error("the Ray cluster's answer to {path} could not be read: {why}")]
    Body {
        /// The path.
        path: String,
        /// What did not fit.
        why: String,
    },
}

/// The cluster's dashboard: where jobs are submitted and nodes listed.
#[derive(Debug, Clone)]
pub struct RayClient {
    host: String,
    port: u16,
    token: Option<String>,
}

impl RayClient {
    /// A client for the dashboard at `address` (`http://HEAD:8265`), with the cluster's token where it runs
    /// with `RAY_AUTH_MODE=token`.
    pub fn new(address: &str, token: Option<String>) -> Result<RayClient, RayError> {
        let bad = || RayError::Address(address.to_owned());
        let rest = address.strip_prefix("http://").ok_or_else(bad)?;
        let authority = rest.trim_end_matches('/');
        let (host, port) = authority.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || authority.contains('/') {
            return Err(bad());
        }
        Ok(RayClient {
            host: host.to_owned(),
            port,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// The dashboard's address, as given.
    pub fn address(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, RayError> {
        let bytes = self.exchange(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| RayError::Body {
            path: path.to_owned(),
            why: e.to_string(),
        })
    }

    /// Sends one request and answers the body of a successful answer.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<BodyBytes, RayError> {
        let unreachable = |why: String| RayError::Unreachable {
            address: self.address(),
            why,
        };
        let exchange = async {
            let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
            tokio::spawn(connection);
            let mut request = hyper::Request::builder()
                .method(method.clone())
                .uri(path)
                .header(hyper::header::HOST, format!("{}:{}", self.host, self.port))
                .header(hyper::header::ACCEPT, "application/json");
            if let Some(token) = &self.token {
                request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
            }
            let bytes = match &body {
                Some(body) => {
                    request = request.header(hyper::header::CONTENT_TYPE, "application/json");
                    BodyBytes::from(body.to_string())
                }
                None => BodyBytes::new(),
            };
            let request = request
                .body(Full::new(bytes))
                .map_err(|e| unreachable(e.to_string()))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, RayError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| unreachable(format!("no answer within {REQUEST_TIMEOUT:?}")))??;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            return Err(RayError::Status {
                method: method.to_string(),
                path: path.to_owned(),
                status: status.as_u16(),
                body: text.chars().take(300).collect(),
            });
        }
        Ok(bytes)
    }

    fn parse<T: for<'de> Deserialize<'de>>(path: &str, value: Value) -> Result<T, RayError> {
        serde_json::from_value(value).map_err(|e| RayError::Body {
            path: path.to_owned(),
            why: e.to_string(),
        })
    }

    /// The Ray version the head runs.
    pub async fn version(&self) -> Result<String, RayError> {
        let path = "/api/version";
        let answer = self.call(Method::GET, path, None).await?;
        answer["ray_version"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| RayError::Body {
                path: path.to_owned(),
                why: "no ray_version".to_owned(),
            })
    }

    /// Every node the cluster knows, alive or dead (the state API).
    pub async fn nodes(&self) -> Result<Vec<Node>, RayError> {
        let path = "/api/v0/nodes?limit=10000&detail=true";
        let answer = self.call(Method::GET, path, None).await?;
        let list = answer
            .pointer("/data/result/result")
            .cloned()
            .ok_or_else(|| RayError::Body {
                path: path.to_owned(),
                why: "no data.result.result".to_owned(),
            })?;
        Self::parse(path, list)
    }

    /// Submits a job; Ray runs it once, never again.
    pub async fn submit(&self, job: &JobRequest) -> Result<(), RayError> {
        let body = serde_json::to_value(job).map_err(|e| RayError::Body {
            path: "/api/jobs/".to_owned(),
            why: e.to_string(),
        })?;
        self.call(Method::POST, "/api/jobs/", Some(body)).await?;
        Ok(())
    }

    /// One job.
    pub async fn job(&self, id: &str) -> Result<Job, RayError> {
        let path = format!("/api/jobs/{id}");
        let answer = self.call(Method::GET, &path, None).await?;
        Self::parse(&path, answer)
    }

    /// Every job the cluster remembers.
    pub async fn jobs(&self) -> Result<Vec<Job>, RayError> {
        let answer = self.call(Method::GET, "/api/jobs/", None).await?;
        Self::parse("/api/jobs/", answer)
    }

    /// Asks Ray to stop a job: SIGTERM to its process group, SIGKILL after the cluster's
    /// `RAY_JOB_STOP_WAIT_TIME_S`.
    pub async fn stop(&self, id: &str) -> Result<(), RayError> {
        self.call(Method::POST, &format!("/api/jobs/{id}/stop"), None)
            .await?;
        Ok(())
    }

    /// Forgets a job that has ended.
    pub async fn delete(&self, id: &str) -> Result<(), RayError> {
        self.call(Method::DELETE, &format!("/api/jobs/{id}"), None)
            .await?;
        Ok(())
    }

    /// The GPUs of a node as its dashboard agent reads them (NVML on that node); none where the node has
    /// no NVIDIA driver, as a node with made-up GPUs.
    pub async fn node_gpus(&self, node_id: &str) -> Result<Vec<GpuReading>, RayError> {
        let path = format!("/nodes/{node_id}");
        let answer = self.call(Method::GET, &path, None).await?;
        let gpus = answer
            .pointer("/data/detail/gpus")
            .cloned()
            .unwrap_or(Value::Null);
        if gpus.is_null() {
            return Ok(Vec::new());
        }
        let read: Vec<AgentGpu> = Self::parse(&path, gpus)?;
        Ok(read.into_iter().map(AgentGpu::reading).collect())
    }

    /// The last `lines` lines job `id` wrote on `node` (the state API, which reads them there).
    pub async fn log_tail(&self, id: &str, node: &str, lines: usize) -> Result<String, RayError> {
        let path = format!("/api/v0/logs/file?node_id={node}&submission_id={id}&lines={lines}");
        let bytes = self.exchange(Method::GET, &path, None).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// What a job wrote.
    pub async fn logs(&self, id: &str) -> Result<String, RayError> {
        let path = format!("/api/jobs/{id}/logs");
        let answer = self.call(Method::GET, &path, None).await?;
        answer["logs"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| RayError::Body {
                path,
                why: "no logs".to_owned(),
            })
    }
}

/// A GPU as a node's agent reports it (Ray's `reporter_models.py`; memory in MiB).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentGpu {
    uuid: String,
    #[serde(default)]
    memory_used: u64,
    /// Percent; `null` where the agent could not read it.
    #[serde(default)]
    utilization_gpu: Option<f64>,
    #[serde(default)]
    processes_pids: Option<Vec<AgentProcess>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentProcess {
    pid: u32,
    #[serde(default)]
    gpu_memory_usage: u64,
}

impl AgentGpu {
    fn reading(self) -> GpuReading {
        GpuReading {
            uuid: self.uuid,
            used: Bytes(self.memory_used * MIB),
            utilisation_percent: self
                .utilization_gpu
                .filter(|u| u.is_finite())
                .map(|u| u.clamp(0.0, 100.0).round() as u32),
            processes: self
                .processes_pids
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.pid, Bytes(p.gpu_memory_usage * MIB)))
                .collect(),
        }
    }
}

/// One GPU of a node, read there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReading {
    /// Its UUID.
    pub uuid: String,
    /// Memory in use by anyone.
    pub used: Bytes,
    /// Percent of the agent's last sample in which a kernel ran, where it could read it.
    pub utilisation_percent: Option<u32>,
    /// Its compute processes (PIDs on that node) and what each takes.
    pub processes: Vec<(u32, Bytes)>,
}

/// A node as the state API lists it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Node {
    /// Ray's id of it.
    pub node_id: String,
    /// Its address, where engines on it are reached.
    pub node_ip: String,
    /// `ALIVE` or `DEAD`.
    pub state: String,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its resources, total.
    #[serde(default)]
    pub resources_total: BTreeMap<String, f64>,
}

impl Node {
    /// Whether Ray counts it alive.
    pub fn alive(&self) -> bool {
        self.state == "ALIVE"
    }
}

/// One GPU of a node, from its resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpu {
    /// Its index on its machine.
    pub index: u32,
    /// Its UUID, what `CUDA_VISIBLE_DEVICES` names it by.
    pub uuid: String,
    /// Its memory.
    pub memory: Bytes,
    /// The resource a job books its share on.
    pub resource: String,
    /// For a MIG instance, its profile (such as `3g.40gb`), where its label gives it.
    pub profile: Option<String>,
}

/// A machine of the cluster: where its engines run and how its GPUs are named there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMachine {
    /// The machine's name (its label).
    pub name: String,
    /// Ray's id of its node now (a node that comes back has a new one).
    pub node_id: String,
    /// The node's address.
    pub address: String,
    /// Its GPUs by index.
    pub gpus: Vec<NodeGpu>,
    /// Its GPUs are made up: the demo engine stands in for what would run.
    pub demo: bool,
    /// Ray counts the node alive.
    pub alive: bool,
    /// The GPUs' model (its label).
    pub model: String,
    /// The CPU cores Ray may use there.
    pub cpu_cores: u32,
    /// The memory Ray may use there.
    pub memory: Bytes,
}

/// The GPU a resource name stands for: `tessera_gpu_{index}_{uuid}`.
fn gpu_of(resource: &str, mib: f64) -> Option<NodeGpu> {
    let rest = resource.strip_prefix(GPU_RESOURCE)?;
    let (index, uuid) = rest.split_once('_')?;
    Some(NodeGpu {
        index: index.parse().ok()?,
        uuid: uuid.to_owned(),
        memory: Bytes(mib as u64 * MIB),
        resource: resource.to_owned(),
        profile: None,
    })
}

/// The machines among `nodes`: each node with Tessera's machine label. A machine listed twice (a node that
/// died and came back under a new id) is the newest alive one.
pub fn machines(nodes: &[Node]) -> Vec<ClusterMachine> {
    let mut by_name: BTreeMap<String, ClusterMachine> = BTreeMap::new();
    for node in nodes {
        let Some(name) = node.labels.get(MACHINE_LABEL) else {
            continue;
        };
        let mut gpus: Vec<NodeGpu> = node
            .resources_total
            .iter()
            .filter_map(|(name, mib)| gpu_of(name, *mib))
            .collect();
        gpus.sort_by_key(|g| g.index);
        for gpu in &mut gpus {
            gpu.profile = node
                .labels
                .get(&format!("{MIG_LABEL}{}", gpu.index))
                .cloned();
        }
        let machine = ClusterMachine {
            name: name.clone(),
            node_id: node.node_id.clone(),
            address: node.node_ip.clone(),
            gpus,
            demo: node.labels.get(DEMO_LABEL).is_some_and(|v| v == "true"),
            alive: node.alive(),
            model: node
                .labels
                .get(MODEL_LABEL)
                .cloned()
                .unwrap_or_else(|| "unknown GPU".to_owned()),
            cpu_cores: node.resources_total.get("CPU").copied().unwrap_or(0.0) as u32,
            memory: Bytes(node.resources_total.get("memory").copied().unwrap_or(0.0) as u64),
        };
        match by_name.get(name) {
            Some(known) if known.alive && !machine.alive => {}
            _ => {
                by_name.insert(name.clone(), machine);
            }
        }
    }
    by_name.into_values().collect()
}

impl ClusterMachine {
    /// The inventory's machine: nothing is known to be held outside Tessera (Ray's dashboard reports GPU
    /// memory only where its node has real GPUs and NVML).
    pub fn machine(&self) -> Machine {
        Machine {
            name: self.name.clone(),
            cpu_cores: self.cpu_cores,
            memory: self.memory,
            all_gpus_visible: false,
            gpus: self
                .gpus
                .iter()
                .map(|g| {
                    let model = self.model.replace('-', " ");
                    // An instance's profile is its label's; one without (a label lost) still is an instance.
                    let mig = placement::mig::instance_of(g.index).map(|(parent, _)| {
                        placement::MigRole::Instance {
                            parent,
                            profile: g.profile.clone().unwrap_or_else(|| "unknown".to_owned()),
                        }
                    });
                    Gpu {
                        index: g.index,
                        uuid: g.uuid.clone(),
                        model: match &mig {
                            Some(placement::MigRole::Instance { profile, .. }) => {
                                placement::mig::instance_name(&model, profile)
                            }
                            _ => model,
                        },
                        vendor: "nvidia".to_owned(),
                        total: g.memory,
                        held_outside: Bytes::ZERO,
                        healthy: self.alive,
                        mig,
                    }
                })
                .collect(),
        }
    }
}

/// A label value as Ray takes it: letters, digits, `-`, `_` and `.`, beginning and ending with a letter or
/// digit, at most 63 characters.
fn label_value(text: &str) -> String {
    let value: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    value
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// The `ray start` line that makes `machine` (as NVML read it) one of Tessera's nodes: a head where `head`
/// is `None`, else a worker joining it.
pub fn start_line(machine: &Machine, head: Option<&str>) -> String {
    let mut line = vec!["ray start".to_owned()];
    match head {
        Some(head) => line.push(format!("--address={head}")),
        None => line.push("--head --dashboard-host=0.0.0.0".to_owned()),
    }
    // The GPUs' model, without the profile a MIG instance's name ends with.
    let model = machine
        .gpus
        .first()
        .map(|g| label_value(placement::mig::model_in_name(&g.model)))
        .unwrap_or_default();
    let mut labels = format!("{MACHINE_LABEL}={}", label_value(&machine.name));
    if !model.is_empty() {
        labels.push_str(&format!(",{MODEL_LABEL}={model}"));
    }
    for gpu in &machine.gpus {
        if let Some(placement::MigRole::Instance { profile, .. }) = &gpu.mig {
            labels.push_str(&format!(
                ",{MIG_LABEL}{}={}",
                gpu.index,
                label_value(profile)
            ));
        }
    }
    line.push(format!("--labels={labels}"));
    let resources: BTreeMap<String, u64> = machine
        .gpus
        .iter()
        .map(|g| {
            (
                format!("{GPU_RESOURCE}{}_{}", g.index, g.uuid),
                g.total.get() / MIB,
            )
        })
        .collect();
    if !resources.is_empty() {
        let json = serde_json::to_string(&resources).unwrap_or_default();
        line.push(format!("--resources='{json}'"));
    }
    line.join(" ")
}

/// A job to submit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRequest {
    /// Its id, chosen by Tessera.
    pub submission_id: String,
    /// The shell command Ray runs.
    pub entrypoint: String,
    /// Its environment.
    pub runtime_env: RuntimeEnv,
    /// What Tessera finds it by again.
    pub metadata: BTreeMap<String, String>,
    /// What it books: its share of each of its GPUs, in MiB.
    pub entrypoint_resources: BTreeMap<String, f64>,
    /// The node it must run on.
    pub entrypoint_label_selector: BTreeMap<String, String>,
}

/// A job's environment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RuntimeEnv {
    /// Its variables.
    pub env_vars: BTreeMap<String, String>,
}

/// A job as the Jobs API describes it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Job {
    /// Tessera's id of it.
    #[serde(default)]
    pub submission_id: Option<String>,
    /// `PENDING`, `RUNNING`, `STOPPED`, `SUCCEEDED` or `FAILED`.
    pub status: String,
    /// Why it is where it is.
    #[serde(default)]
    pub message: Option<String>,
    /// What Tessera gave it.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Its process's exit code, once it has one.
    #[serde(default)]
    pub driver_exit_code: Option<i64>,
    /// The node it runs on, once it has started on one.
    #[serde(default)]
    pub driver_node_id: Option<String>,
}

impl Job {
    /// Whether it has ended for good.
    pub fn terminal(&self) -> bool {
        matches!(self.status.as_str(), "STOPPED" | "SUCCEEDED" | "FAILED")
    }

    /// One of its metadata.
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.get(key).map(String::as_str)
    }
}

#[cfg(test)]
mod tests;
