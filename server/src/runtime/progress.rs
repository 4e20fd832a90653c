//! How far a loading engine has got, read from its own log the way each engine prints it: vLLM's
//! checkpoint-shard bar and CUDA-graph capture, SGLang's load and memory-pool lines, llama.cpp's tensor and
//! KV-cache lines. The demo engine prints vLLM's. Shown as the starting engine's message.

/// The newest progress `lines` (an engine's last lines, oldest first) say, in words.
pub(super) fn load_progress(lines: &[String]) -> Option<String> {
    lines.iter().rev().find_map(|line| progress_of(line))
}

fn progress_of(line: &str) -> Option<String> {
    if let Some(rest) = after(line, "Loading safetensors checkpoint shards:") {
        // `  50% Completed | 2/4 [00:01<00:01, …]`
        let percent = rest.split('%').next()?.trim();
        let count = rest.split('|').nth(1)?.split_whitespace().next()?;
        let (done, all) = count.split_once('/')?;
        return Some(format!(
            "loading its weights: {done} of {all} checkpoint shards ({percent}%)"
        ));
    }
    if let Some(rest) = after(line, "Capturing CUDA graph") {
        let percent = rest.split('%').next()?.rsplit(':').next()?.trim();
        return Some(format!("capturing CUDA graphs ({percent}%)"));
    }
    let phases = [
        // vLLM
        (
            "Memory profiling takes",
            "profiling its memory for the KV cache",
        ),
        ("# GPU blocks:", "allocating its KV cache"),
        // SGLang
        ("Load weight begin", "loading its weights"),
        ("Load weight end", "allocating its memory pool"),
        ("Memory pool end", "capturing CUDA graphs"),
        // llama.cpp
        ("load_tensors: loading model tensors", "loading its tensors"),
        ("llama_kv_cache", "allocating its KV cache"),
        ("llama_context:", "setting up its context"),
        ("warming up the model", "warming up"),
    ];
    phases
        .iter()
        .find(|(mark, _)| line.contains(mark))
        .map(|(_, words)| (*words).to_owned())
}

fn after<'a>(line: &'a str, mark: &str) -> Option<&'a str> {
    line.find(mark).map(|at| &line[at + mark.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn the_newest_progress_line_of_vllm_sglang_or_llama_cpp_is_said_in_words() {
        let vllm = lines(
            "INFO 12-05 07:00:01 [model_runner.py:1] Starting to load model zai-org/GLM...\n\
             Loading safetensors checkpoint shards:  25% Completed | 1/4 [00:05<00:15,  5.01s/it]\n\
             Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:10<00:10,  5.00s/it]\n",
        );
        assert_eq!(
            load_progress(&vllm).as_deref(),
            Some("loading its weights: 2 of 4 checkpoint shards (50%)")
        );
        let graphs = lines("Capturing CUDA graph shapes:  40%|████      | 14/35 [00:03<00:04]");
        assert_eq!(
            load_progress(&graphs).as_deref(),
            Some("capturing CUDA graphs (40%)")
        );
        let sglang = lines("[2026-12-05 07:00:01 TP0] Load weight begin. avail mem=78.50 GB");
        assert_eq!(
            load_progress(&sglang).as_deref(),
            Some("loading its weights")
        );
        let llama = lines(
            "load_tensors: loading model tensors, this can take a while... (mmap = true)\n\
             llama_kv_cache: size =  512.00 MiB\n",
        );
        assert_eq!(
            load_progress(&llama).as_deref(),
            Some("allocating its KV cache")
        );
        assert_eq!(load_progress(&lines("nothing yet")), None);
    }
}
