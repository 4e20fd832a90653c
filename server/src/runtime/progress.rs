//! What an engine's own log says, read the way each engine prints it. How far a loading engine has got:
//! vLLM's checkpoint-shard bar and CUDA-graph capture, SGLang's load and memory-pool lines, llama.cpp's
//! tensor and KV-cache lines (the demo engine prints vLLM's), shown as the starting engine's message. And
//! what it allocated, where it says (llama.cpp's buffer lines): its own report of its memory, kept as its
//! measurement where the GPU's reading cannot tie memory to its processes.

use placement::Bytes;

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

/// What llama.cpp's log says it allocated on each of its GPUs, by the number it gives each (`CUDA0`,
/// `CUDA1`: the order of the engine's GPUs): its model, KV cache, compute and output buffers, as in
/// `llama_kv_cache:      CUDA0 KV buffer size =    64.00 MiB`. Buffers in the host's memory (`CPU`,
/// `CPU_Mapped`, `CUDA_Host`) are no GPU's, but a build with no GPU at all (on CPU, as in the tests here)
/// allocates only there: that is reported as its first GPU's. Empty where the log says nothing of it.
pub(super) fn reported_memory(lines: &[String]) -> Vec<Bytes> {
    let buffers: Vec<(&str, f64)> = lines
        .iter()
        .filter_map(|line| {
            let (left, right) = line.split_once(" buffer size =")?;
            let mut words = left.split_whitespace().rev();
            let part = words.next()?;
            let device = words.next()?;
            let mib: f64 = right.trim().strip_suffix("MiB")?.trim().parse().ok()?;
            ["model", "KV", "compute", "output"]
                .contains(&part)
                .then_some((device, mib))
        })
        .collect();
    let host = |device: &str| device.starts_with("CPU") || device.ends_with("_Host");
    let on_gpus = buffers.iter().any(|(device, _)| !host(device));
    let mut per_gpu: Vec<f64> = Vec::new();
    for (device, mib) in buffers {
        let ordinal = match (on_gpus, host(device)) {
            (true, true) => continue,
            (false, _) => 0,
            (true, false) => device
                .trim_start_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .unwrap_or(0),
        };
        if per_gpu.len() <= ordinal {
            per_gpu.resize(ordinal + 1, 0.0);
        }
        per_gpu[ordinal] += mib;
    }
    per_gpu
        .into_iter()
        .map(|mib| Bytes((mib * f64::from(1u32 << 20)).round() as u64))
        .collect()
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

    #[test]
    fn llama_cpp_s_buffer_lines_say_what_it_allocated_on_each_gpu_and_on_cpu_alone_as_its_first() {
        let mib = |m: f64| Bytes((m * 1_048_576.0).round() as u64);
        // Two GPUs (a CUDA build): the host's buffers are no GPU's.
        let cuda = lines(
            "load_tensors: offloaded 33/33 layers to GPU\n\
             load_tensors:        CUDA0 model buffer size =  2201.75 MiB\n\
             load_tensors:        CUDA1 model buffer size =  2201.74 MiB\n\
             load_tensors:   CPU_Mapped model buffer size =   281.81 MiB\n\
             llama_context:  CUDA_Host  output buffer size =     0.49 MiB\n\
             llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB\n\
             llama_kv_cache:      CUDA1 KV buffer size =   512.00 MiB\n\
             llama_context:      CUDA0 compute buffer size =   560.00 MiB\n\
             llama_context:      CUDA1 compute buffer size =   560.00 MiB\n\
             llama_context:  CUDA_Host compute buffer size =    24.01 MiB\n",
        );
        assert_eq!(
            reported_memory(&cuda),
            [mib(2201.75 + 512.0 + 560.0), mib(2201.74 + 512.0 + 560.0)]
        );
        // What xllamacpp's CPU build printed here for the tests' tiny model (-c 512 -np 2).
        let cpu = lines(
            "0.00.004.748 I load_tensors:   CPU_Mapped model buffer size =     0.44 MiB\n\
             0.00.005.205 I llama_context:        CPU  output buffer size =     0.00 MiB\n\
             0.00.005.269 I llama_kv_cache:        CPU KV buffer size =     0.25 MiB\n\
             0.00.006.154 I sched_reserve:        CPU compute buffer size =     1.39 MiB\n",
        );
        assert_eq!(reported_memory(&cpu), [mib(0.44 + 0.25 + 1.39)]);
        assert!(reported_memory(&lines("llama_kv_cache: size =  512.00 MiB")).is_empty());
    }
}
