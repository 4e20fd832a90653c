// BENCHMARKS.md: the time of one plan verdict for 64 members in Chromium, through the wasm bundle the page
// loads (a release build when scripts/bench-console runs this). Measured, printed, and never asserted on.
import { expect, test } from "../tests/fixtures/tessera";
import { open } from "../tests/fixtures/console";

test("one plan verdict for 64 members", async ({ page }) => {
  await open(page, "/deploy");
  // A string, so that the test runner's transpiler leaves the browser's own import() alone. The module is
  // the one the page already loaded and initialised.
  const result: { runs: number[]; sixteen: number } = await page.evaluate(`(async () => {
    const bundle = await import("/pkg/tessera.js");
    bundle.time_verdict(64, 2000);
    const runs = [1, 2, 3, 4, 5].map(() => bundle.time_verdict(64, 20000));
    return { runs, sixteen: bundle.time_verdict(16, 20000) };
  })()`);
  const sorted = [...result.runs].sort((a, b) => a - b);
  const median = sorted[2];
  console.log(
    `plan verdict, 64 members: median ${median.toFixed(2)} µs over 5 runs of 20,000 (${sorted.map((r) => r.toFixed(2)).join(", ")}); 16 members: ${result.sixteen.toFixed(2)} µs`,
  );
  expect(Number.isFinite(median)).toBe(true);
});
