//! A model's files read on a Ray node (issue 32): a short job pinned to the node runs
//! `read_model_files.py` there, which prints what it read (a file's first bytes, or a folder's config and
//! safetensors headers, never the weights) on one line of its log; the estimate parses that as it parses
//! this machine's files ([`Files`]).

use super::job::ending;
use super::{quote, submission_id, RayExecutor, META_INSTANCE};
use crate::inventory::ray::{JobRequest, RuntimeEnv, MACHINE_LABEL};
use crate::runtime::model_file::{Files, FolderHeaders, Miss, Prefix};
use async_trait::async_trait;
use base64::Engine as _;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::{sleep, Instant};

/// The reader the job runs with the node's Python, which is there wherever Ray runs.
const READER: &str = include_str!("read_model_files.py");

/// How the reader's answer begins in the job's log.
const ANSWER_MARK: &str = "tessera-files:";

/// On a job that reads a model's files (not an engine): the path it reads.
pub(super) const META_FILES: &str = "tessera_files";

/// How long a read waits for its job to be scheduled on the node and to end: within the REST API's request
/// bound (30 s), which an estimate is asked under.
const PATIENCE: Duration = Duration::from_secs(20);

/// How often a read asks whether its job has ended: a header is read in well under a second.
const POLL: Duration = Duration::from_millis(250);

/// The model files on one machine's Ray node.
pub(crate) struct NodeFiles {
    executor: RayExecutor,
    machine: String,
}

impl RayExecutor {
    /// The model files on `machine`'s node, read by jobs there.
    pub(crate) fn files(&self, machine: &str) -> NodeFiles {
        NodeFiles {
            executor: self.clone(),
            machine: machine.to_owned(),
        }
    }
}

/// What the reader printed: one of the misses, or what it read.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Answer {
    missing: bool,
    folder: bool,
    file: bool,
    unreadable: Option<String>,
    len: Option<u64>,
    bytes: Option<String>,
    config: Option<String>,
    shards: Option<Vec<(String, String)>>,
}

impl NodeFiles {
    /// The job that runs the reader with `args` on the node.
    fn request(&self, path: &str, args: &[String]) -> Result<JobRequest, Miss> {
        let words = std::iter::once(READER.to_owned())
            .chain(args.iter().cloned())
            .map(|word| quote(&word))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| self.unreadable(path, error))?;
        Ok(JobRequest {
            submission_id: submission_id(&format!("files_{}", self.machine)),
            entrypoint: format!("python3 -c {}", words.join(" ")),
            runtime_env: RuntimeEnv::default(),
            metadata: BTreeMap::from([
                (META_INSTANCE.to_owned(), self.executor.0.instance.clone()),
                (META_FILES.to_owned(), path.to_owned()),
            ]),
            entrypoint_resources: BTreeMap::new(),
            entrypoint_label_selector: BTreeMap::from([(
                MACHINE_LABEL.to_owned(),
                self.machine.clone(),
            )]),
        })
    }

    fn unreadable(&self, path: &str, why: String) -> Miss {
        Miss::Unreadable {
            path: path.to_owned(),
            error: format!("its reading job on the Ray node {}: {why}", self.machine),
        }
    }

    /// Runs the reader with `args` on the node and answers what it printed. The job is deleted once it has
    /// ended, and stopped where it has not ended in time.
    async fn read(&self, path: &str, args: &[String]) -> Result<Answer, Miss> {
        let request = self.request(path, args)?;
        let client = &self.executor.0.client;
        let id = &request.submission_id;
        let fail = |why: String| self.unreadable(path, why);
        // Ray would keep a job for a dead node PENDING until it returns.
        let nodes = client.nodes().await.map_err(|e| fail(e.to_string()))?;
        if !crate::inventory::ray::machines(&nodes)
            .iter()
            .any(|m| m.name == self.machine && m.alive)
        {
            return Err(fail("the node is unreachable".to_owned()));
        }
        if let Ok(jobs) = client.jobs().await {
            self.executor.sweep_errands(&jobs).await;
        }
        client
            .submit(&request)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let deadline = Instant::now() + PATIENCE;
        let ended = loop {
            match client.job(id).await {
                Ok(job) if job.terminal() => break Ok(job),
                _ if Instant::now() >= deadline => {
                    break Err(fail(format!("it had not ended after {PATIENCE:?}")))
                }
                _ => sleep(POLL).await,
            }
        };
        let logs = match &ended {
            Ok(_) => client.logs(id).await.map_err(|e| fail(e.to_string())),
            Err(late) => {
                if let Err(e) = client.stop(id).await {
                    tracing::debug!("Ray job {id} not stopped: {e}");
                }
                Err(late.clone())
            }
        };
        if let Err(e) = client.delete(id).await {
            // One stopped just now ends later: the next errand's sweep deletes it.
            tracing::debug!("Ray job {id} not deleted: {e}");
        }
        let job = ended?;
        let logs = logs?;
        answer(&logs).ok_or_else(|| {
            let last = logs.lines().last().unwrap_or_default();
            fail(format!("{}; it printed no answer: {last}", ending(&job)))
        })
    }
}

/// The reader's answer in a job's log.
fn answer(logs: &str) -> Option<Answer> {
    logs.lines()
        .find_map(|line| line.strip_prefix(ANSWER_MARK))
        .and_then(|json| serde_json::from_str(json).ok())
}

/// What an answer says was missed instead, if it does.
fn miss(answer: &Answer) -> Option<Miss> {
    if answer.missing {
        return Some(Miss::Missing);
    }
    if answer.folder {
        return Some(Miss::Folder);
    }
    if answer.file {
        return Some(Miss::File);
    }
    answer.unreadable.clone().map(unread)
}

/// A miss for what the reader could not give, its path said later ([`placed`]).
fn unread(error: String) -> Miss {
    Miss::Unreadable {
        path: String::new(),
        error,
    }
}

fn decode(text: &str) -> Result<Vec<u8>, Miss> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| unread(format!("its answer is not base64: {e}")))
}

/// A prefix as the reader answered it.
fn prefix_of(answer: Answer) -> Result<Prefix, Miss> {
    if let Some(miss) = miss(&answer) {
        return Err(miss);
    }
    let (Some(len), Some(bytes)) = (answer.len, answer.bytes) else {
        return Err(unread("its answer has no bytes".to_owned()));
    };
    Ok(Prefix {
        len,
        bytes: decode(&bytes)?,
    })
}

/// A folder's headers as the reader answered them.
fn folder_of(answer: Answer) -> Result<FolderHeaders, Miss> {
    if let Some(miss) = miss(&answer) {
        return Err(miss);
    }
    Ok(FolderHeaders {
        config: answer.config.as_deref().map(decode).transpose()?,
        shards: answer
            .shards
            .unwrap_or_default()
            .into_iter()
            .map(|(name, header)| Ok((name, decode(&header)?)))
            .collect::<Result<_, Miss>>()?,
    })
}

/// A miss with the path and the node said, where the reader left them out.
fn placed(miss: Miss, path: &str, machine: &str) -> Miss {
    match miss {
        Miss::Unreadable { path: at, error } => Miss::Unreadable {
            path: if at.is_empty() { path.to_owned() } else { at },
            error: format!("{error} (on the Ray node {machine})"),
        },
        miss => miss,
    }
}

#[async_trait]
impl Files for NodeFiles {
    fn place(&self) -> String {
        format!("the Ray node {}", self.machine)
    }

    async fn prefix(&self, path: &str, want: u64) -> Result<Prefix, Miss> {
        let args = ["prefix".to_owned(), path.to_owned(), want.to_string()];
        let answer = self.read(path, &args).await?;
        prefix_of(answer).map_err(|m| placed(m, path, &self.machine))
    }

    async fn folder(&self, path: &str) -> Result<FolderHeaders, Miss> {
        let args = ["folder".to_owned(), path.to_owned()];
        let answer = self.read(path, &args).await?;
        folder_of(answer).map_err(|m| placed(m, path, &self.machine))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::model_file::ThisMachine;

    /// Runs the node's reader here, with this machine's Python, as a job's entrypoint would.
    fn run_reader(args: &[&str]) -> Answer {
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(READER)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        answer(&String::from_utf8_lossy(&out.stdout)).expect("an answer")
    }

    #[tokio::test]
    async fn the_node_s_reader_reads_the_same_header_and_folder_as_this_machine_and_never_past_them(
    ) {
        use placement::estimate::writer::llama;
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("m.gguf");
        let mut bytes = llama(2, 64, 128, 4, 2, 300, 0).header();
        bytes.resize(bytes.len() + 100_000, 0xAB);
        std::fs::write(&gguf, &bytes).unwrap();
        let gguf = gguf.display().to_string();
        let node = prefix_of(run_reader(&["prefix", &gguf, "4096"])).unwrap();
        assert_eq!(node, ThisMachine.prefix(&gguf, 4096).await.unwrap());
        assert_eq!((node.len, node.bytes.len()), (bytes.len() as u64, 4096));

        let folder = dir.path().join("hf");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("config.json"), br#"{"hidden_size": 64}"#).unwrap();
        let json = br#"{"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}"#;
        let mut shard = (json.len() as u64).to_le_bytes().to_vec();
        shard.extend(json);
        let header = shard.clone();
        shard.extend([0xAB; 8]);
        std::fs::write(folder.join("model.safetensors"), &shard).unwrap();
        std::fs::write(folder.join("README.md"), b"not a shard").unwrap();
        let folder = folder.display().to_string();
        let node = folder_of(run_reader(&["folder", &folder])).unwrap();
        assert_eq!(node, ThisMachine.folder(&folder).await.unwrap());
        assert_eq!(node.shards, [("model.safetensors".to_owned(), header)]);
    }

    #[test]
    fn the_node_s_reader_says_what_it_found_in_place_of_what_was_asked() {
        let dir = tempfile::tempdir().unwrap();
        let here = dir.path().display().to_string();
        let missing = format!("{here}/nothing.gguf");
        assert_eq!(
            prefix_of(run_reader(&["prefix", &missing, "10"])),
            Err(Miss::Missing)
        );
        assert_eq!(
            prefix_of(run_reader(&["prefix", &here, "10"])),
            Err(Miss::Folder)
        );
        let file = format!("{here}/m.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        assert_eq!(folder_of(run_reader(&["folder", &file])), Err(Miss::File));
        let empty = folder_of(run_reader(&["folder", &here])).unwrap();
        assert_eq!((empty.config, empty.shards.len()), (None, 0));
    }
}
