//! Cutting one of this machine's GPUs into MIG instances, and joining them back, through `nvidia-smi`
//! (seed 004). The fleet asks only for a GPU that runs nothing: MIG mode and instances change only there.
//!
//! A cut turns MIG mode on, checks that it took (some boards only after a GPU reset), clears what
//! instances were there, then creates each instance of the layout with its default compute instance. A
//! cut that fails half-way is undone, so the GPU is left whole rather than cut into part of a layout.

use placement::mig::Layout;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::timeout;

/// The longest one `nvidia-smi` call may take: enabling MIG mode may reset the GPU, which takes seconds,
/// not minutes. It runs outside the fleet's write lock, so a slow call holds up only its own GPU.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// `nvidia-smi`, run for one GPU at a time.
#[derive(Debug, Clone)]
pub struct NvidiaSmi {
    /// The program.
    pub program: PathBuf,
    /// The longest one call may take.
    pub timeout: Duration,
}

impl NvidiaSmi {
    /// Cuts GPU `index` into `layout`'s instances, or says why it could not and leaves it whole.
    pub async fn cut(&self, index: u32, layout: &Layout) -> Result<(), String> {
        let gpu = index.to_string();
        self.run(&["-i", &gpu, "-mig", "1"]).await?;
        let mode = match self
            .run(&[
                "-i",
                &gpu,
                "--query-gpu=mig.mode.current",
                "--format=csv,noheader",
            ])
            .await
        {
            Ok(mode) => mode,
            Err(why) => {
                let _ = self.run(&["-i", &gpu, "-mig", "0"]).await;
                return Err(why);
            }
        };
        if mode.trim() != "Enabled" {
            // Pending until the GPU is reset: turning it back off leaves nothing pending behind.
            let _ = self.run(&["-i", &gpu, "-mig", "0"]).await;
            return Err(format!(
                "MIG mode of GPU {index} is {:?}, not Enabled: this board turns it on only after a GPU reset (nvidia-smi -r -i {index}) or a reboot, which Tessera does not do; reset it, then cut it again",
                mode.trim()
            ));
        }
        self.clear(&gpu).await;
        for args in layout.create_args(index) {
            let words: Vec<&str> = args.iter().map(String::as_str).collect();
            if let Err(why) = self.run(&words).await {
                let undone = self.join(index).await;
                return Err(match undone {
                    Ok(()) => format!(
                        "{why}; the instances made before it were removed and the GPU left whole"
                    ),
                    Err(also) => format!("{why}; undoing the cut failed too: {also}"),
                });
            }
        }
        Ok(())
    }

    /// Removes GPU `index`'s instances and turns its MIG mode off.
    pub async fn join(&self, index: u32) -> Result<(), String> {
        let gpu = index.to_string();
        self.clear(&gpu).await;
        self.run(&["-i", &gpu, "-mig", "0"]).await.map(drop)
    }

    /// Destroys every compute instance, then every GPU instance. Each fails where there is none, which is
    /// not a failure here: what must be gone is gone either way, and a creation after it says otherwise.
    async fn clear(&self, gpu: &str) {
        for flag in ["-dci", "-dgi"] {
            if let Err(why) = self.run(&["mig", "-i", gpu, flag]).await {
                tracing::debug!("{why}");
            }
        }
    }

    /// Runs `nvidia-smi args`, answering what it printed, or what it said when it failed.
    async fn run(&self, args: &[&str]) -> Result<String, String> {
        let line = format!("{} {}", self.program.display(), args.join(" "));
        let output = timeout(
            self.timeout,
            tokio::process::Command::new(&self.program)
                .args(args)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .map_err(|_| format!("{line} did not return within {:?}", self.timeout))?
        .map_err(|e| format!("{line}: {e}"))?;
        let said = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_owned();
        if output.status.success() {
            Ok(said(&output.stdout))
        } else {
            let stderr = said(&output.stderr);
            let stdout = said(&output.stdout);
            let told = if stderr.is_empty() { stdout } else { stderr };
            Err(format!("{line} failed ({}): {told}", output.status))
        }
    }
}
