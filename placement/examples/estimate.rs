//! Prints the memory estimate of a GGUF file as JSON, as the server would make it: reading the header only.
//!
//!     cargo run -p placement --example estimate -- MODEL.gguf [--context N] [--slots N]
//!         [--cache-type f16|q8_0|...] [--unified] [--batch N] [--ubatch N] [--swa-full]
//!
//! `--context` is each slot's context (llama.cpp's `-c` is that times the slots). `scripts/bench-estimate`
//! compares what this prints with what llama.cpp reports it allocated.

use placement::estimate::{estimate_gguf, GgmlType, GgufError, Settings};
use placement::Bytes;
use std::io::Read;
use std::process::ExitCode;

/// The first read: enough for the headers of nearly all models.
const FIRST_READ: u64 = 8 << 20;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("estimate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let mut settings = Settings::default();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number = |text: String| text.parse::<u32>().map_err(|e| format!("{text}: {e}"));
        match arg.as_str() {
            "--context" => settings.context = Some(number(value("--context")?)?),
            "--slots" => settings.slots = number(value("--slots")?)?,
            "--batch" => settings.batch = number(value("--batch")?)?,
            "--ubatch" => settings.ubatch = number(value("--ubatch")?)?,
            "--cache-type" => {
                let name = value("--cache-type")?;
                let t = GgmlType::from_name(&name).ok_or(format!("unknown cache type {name}"))?;
                settings.cache_type_k = t;
                settings.cache_type_v = t;
            }
            "--unified" => settings.unified_kv = true,
            "--swa-full" => settings.swa_full = true,
            _ if path.is_none() && !arg.starts_with("--") => path = Some(arg),
            _ => return Err(format!("unexpected argument {arg}")),
        }
    }
    let path = path.ok_or("usage: estimate MODEL.gguf [--context N] [--slots N] ...")?;
    let mut file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let file_len = file.metadata().map_err(|e| format!("{path}: {e}"))?.len();
    let mut prefix = Vec::new();
    let mut want = FIRST_READ.min(file_len);
    let estimate = loop {
        let more = want - prefix.len() as u64;
        (&mut file)
            .take(more)
            .read_to_end(&mut prefix)
            .map_err(|e| format!("{path}: {e}"))?;
        match estimate_gguf(&prefix, Some(Bytes(file_len)), &settings) {
            Err(GgufError::Truncated { needed }) if needed <= file_len && want < file_len => {
                want = needed.max(2 * want).min(file_len);
            }
            other => break other.map_err(|e| format!("{path}: {e}"))?,
        }
    };
    let mut json = serde_json::to_value(&estimate).map_err(|e| e.to_string())?;
    json["total"] = estimate.total().get().into();
    json["gap_texts"] = estimate.gaps.iter().map(ToString::to_string).collect();
    json["caveat_texts"] = estimate.caveats.iter().map(ToString::to_string).collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?
    );
    Ok(())
}
