// Times the repack planner in wasm (see scripts/bench-repack): 20 triplet instances per size, each run once
// cold, against first fit decreasing in the same module and the same run.
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";

const { instance } = await WebAssembly.instantiate(readFileSync(process.argv[2]));
const { planner, ffd, build } = instance.exports;
console.log("items | instances | planner at optimum | FFD at optimum | planner ms (median, max) | FFD ms (median)");
for (const bins of [20, 40, 83, 100]) {
  const times = [];
  const ffdTimes = [];
  let hits = 0;
  let ffdHits = 0;
  for (let seed = 1; seed <= 20; seed++) {
    let t = performance.now();
    build(bins, seed);
    const setup = performance.now() - t;
    t = performance.now();
    hits += planner(bins, seed) === bins ? 1 : 0;
    times.push(performance.now() - t - setup);
    t = performance.now();
    ffdHits += ffd(bins, seed) === bins ? 1 : 0;
    ffdTimes.push(performance.now() - t - setup);
  }
  times.sort((a, b) => a - b);
  ffdTimes.sort((a, b) => a - b);
  const ms = (x) => x.toFixed(2);
  console.log(
    `${bins * 3} | 20 | ${hits} | ${ffdHits} | ${ms(times[10])}, ${ms(times[19])} | ${ms(ffdTimes[10])}`,
  );
}
