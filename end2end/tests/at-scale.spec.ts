// The console at the size of a real fleet (issue 29): 1,250 machines of 8 GPUs beside the demo fleet. The
// Nodes tab is searched and paged, the Overview sums 10,000 GPUs, the wizard's node list is searched, the
// repack lists its plan fifty at a time, and each passes axe-core.
import AxeBuilder from "@axe-core/playwright";
import { expect, test } from "./fixtures/tessera";
import { open, Wizard } from "./fixtures/console";

/** 1,250 machines named gpu-0000 to gpu-1249, each with eight 80 GB GPUs. */
function fleet(): string {
  const lines: string[] = [];
  for (let m = 0; m < 1250; m++) {
    const name = `gpu-${String(m).padStart(4, "0")}`;
    lines.push(`[[machine]]`, `name = "${name}"`, `cpu_cores = 128`, `memory_gb = 1024`);
    for (let g = 0; g < 8; g++) {
      lines.push(`[[machine.gpu]]`, `index = ${g}`, `uuid = "GPU-${name}-${g}"`, `model = "NVIDIA H100 80GB HBM3"`, `memory_gb = 80`);
    }
  }
  return lines.join("\n") + "\n";
}

test.use({ inventory: fleet() });

test("with 1,250 machines the nodes tab finds one by name and pages the rest, and the overview sums them with thousands separators and one memory bar", async ({ page }) => {
  await open(page, "/nodes");
  // The demo fleet's four machines and the 1,250.
  await expect(page.getByTestId("nodes-page")).toHaveText("Page 1 of 26 · nodes 1–50 of 1254");
  await expect(page.getByTestId("node-row")).toHaveCount(50);
  const violations = (await new AxeBuilder({ page }).analyze()).violations.filter(
    (v) => v.impact === "serious" || v.impact === "critical",
  );
  expect(violations.map((v) => v.id)).toEqual([]);

  // Each row pictures its GPUs in one element: fifty pictures, of eight cells each.
  await expect(page.getByTestId("gpu-cells")).toHaveCount(50);
  await expect(page.getByTestId("gpu-cells").first()).toHaveAttribute("aria-label", /^\d+ GPUs: /);
  await page.screenshot({ path: test.info().outputPath("nodes-1250.png") });
  await page.getByRole("button", { name: "Next" }).click();
  await expect(page.getByTestId("nodes-page")).toHaveText("Page 2 of 26 · nodes 51–100 of 1254");
  await expect(page).toHaveURL(/\/nodes\?page=2$/);

  await page.getByTestId("nodes-search").fill("gpu-0777");
  await expect(page.getByTestId("nodes-page")).toHaveText("Page 1 of 1 · node 1 of 1 matching, of 1254");
  await expect(page.getByTestId("node-row")).toHaveText(/gpu-0777/);
  await page.getByTestId("node-row").getByRole("link", { name: "gpu-0777" }).click();
  await expect(page).toHaveURL(/\/machines\/gpu-0777$/);

  await open(page, "/nodes?q=nothing-like-it");
  await expect(page.getByTestId("no-match")).toHaveText('No node, group or model holds "nothing-like-it".');

  await open(page, "/");
  await expect(page.getByTestId("machines")).toHaveText("1,254");
  await expect(page.getByTestId("gpus")).toHaveText("10,013");
  // The fleet's memory in one bar, however many GPUs: one element, four segments.
  await expect(page.getByTestId("fleet-bar").locator("rect.seg:not(.left)")).toHaveCount(4);
  await page.screenshot({ path: test.info().outputPath("overview-1250.png") });
});

test("with 1,250 machines the wizard lists fifty nodes, finds one by name and keeps a chosen node in view", async ({ page }) => {
  const wizard = new Wizard(page);
  await wizard.open();
  const shown = page.getByTestId("nodes-shown");
  const listed = page.locator("fieldset.nodes li");
  await expect(shown).toHaveText("The first 50 of 1254 nodes that match, of 1254: type more of a name to find another.");
  await expect(listed).toHaveCount(50);
  const violations = (await new AxeBuilder({ page }).analyze()).violations.filter(
    (v) => v.impact === "serious" || v.impact === "critical",
  );
  expect(violations.map((v) => v.id)).toEqual([]);

  const find = page.getByLabel("Find a node");
  await find.fill("GPU-0777");
  await expect(shown).toHaveText("1 of 1254 nodes.");
  await page.locator("#node-gpu-0777").check();
  // gpu-1200 to gpu-1249 match; the chosen node stays listed, checked, in its place in the fleet (first).
  await find.fill("gpu-12");
  await expect(shown).toHaveText("50 of 1254 nodes.");
  await expect(listed).toHaveCount(51);
  await expect(listed.first()).toContainText("gpu-0777");
  await expect(page.locator("#node-gpu-0777")).toBeChecked();
  await find.fill("nothing-like-it");
  await expect(shown).toHaveText('No node\'s name holds "nothing-like-it".');
  await expect(listed).toHaveCount(1);
});

test("with 1,250 machines the repack lists fifty moves at a time, the GPUs it changes and names eight it frees", async ({ page, request }) => {
  // A bound on a hang, not a speed test: the debug build the tests run plans the 10,000 GPUs once, on the
  // server (the page hydrates with that plan, and plans in the wasm only when the ask changes).
  test.setTimeout(120_000);
  // 240 workers of 40 GB: best fit packs two to a GPU. Every other one ends: 120 GPUs half full, which
  // a repack empties half of.
  for (let w = 0; w < 240; w++) {
    const r = await request.post("/api/workers", {
      data: { name: `half-${w}`, requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: 40 } } },
    });
    expect(r.status(), await r.text()).toBe(201);
  }
  for (let w = 0; w < 240; w += 2) {
    expect((await request.delete(`/api/workers/half-${w}`)).status()).toBe(204);
  }
  await page.goto("/repack");
  await expect(page.locator('main[data-hydrated="true"]')).toHaveCount(1, { timeout: 60_000 });
  const summary = page.getByTestId("repack-summary");
  await expect(summary).toHaveText(/^Frees (\d+) GPUs: (GPU \d+ of [\w-]+, ){7}GPU \d+ of [\w-]+ and \d+ more — \d+ moves, \d+ restarts\./);
  const [, freed, moves] = /^Frees (\d+) GPUs: .* — (\d+) moves/.exec((await summary.textContent()) ?? "")!;
  const total = Number(moves);
  expect(Number(freed)).toBeGreaterThanOrEqual(60);
  expect(total).toBeGreaterThan(50);
  await expect(page.getByTestId("repack-move")).toHaveCount(50);
  const shownMoves = page.getByTestId("repack-moves-shown");
  await expect(shownMoves).toContainText(`The first 50 of ${total} moves.`);
  await expect(page.getByTestId("repack-step")).toHaveCount(50);
  // Only the GPUs the plan changes, fifty at first; the other GPUs of the 10,000 are counted.
  await expect(page.locator("[data-testid=repack-fleet] tbody tr")).toHaveCount(50);
  await expect(page.getByTestId("repack-unchanged")).toHaveText(/^The other \d+ GPUs stay as they are\.$/);
  const violations = (await new AxeBuilder({ page }).analyze()).violations.filter(
    (v) => v.impact === "serious" || v.impact === "critical",
  );
  expect(violations.map((v) => v.id)).toEqual([]);

  await shownMoves.getByRole("button").click();
  await expect(page.getByTestId("repack-move")).toHaveCount(Math.min(total, 100));
});
