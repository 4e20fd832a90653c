// The Nodes tab (seed 003) and a machine's page (seed 000), as an operator reads them.
import { deploy, expect, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test("each node's row names its group, its models with their shares, and the memory left", async ({ page, request }) => {
  // 6.25 % of each 96 GB GPU is 6 GB: 180 of atlas's 192 GB are left.
  await deploy(request, { model: "vision", gpus: ["atlas:0", "atlas:1"], share: 6.25 });
  await open(page, "/nodes");
  const atlas = page.locator('tr[data-node="atlas"]');
  await expect(atlas.getByTestId("node-group")).toHaveText("vision");
  await expect(atlas.getByTestId("node-models")).toHaveText("vision 6.25%");
  await expect(atlas.getByTestId("node-memory")).toHaveText("2 of 2 shareable · 180 GB free (94%)");
  await expect(page.locator('tr[data-node="majin"]').getByTestId("node-memory")).toHaveText("1 of 1 shareable · 7 GB free (88%)");
  await page.screenshot({ path: test.info().outputPath("nodes.png"), fullPage: true });
  await atlas.getByRole("link", { name: "atlas" }).click();
  await expect(page).toHaveURL(/\/machines\/atlas$/);
  await expect(page.getByRole("heading", { name: "atlas", level: 1 })).toBeVisible();
});

test("the machine page shows what each GPU offers, its sharers, and who waits and why", async ({ page, request }) => {
  for (const [name, gb] of [["listen", 2.2], ["voice", 4.2]] as const) {
    const r = await request.post("/api/workers", {
      data: { name, requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: gb } } },
    });
    expect(r.status()).toBe(201);
  }
  // Only an RTX 4060 will do, and majin's has 0.6 GB left.
  const late = await request.post("/api/workers", {
    data: { name: "late", requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: 1.5, models: ["NVIDIA GeForce RTX 4060"] } } },
  });
  expect((await late.json()).state).toBe("pending");

  await open(page, "/machines/majin");
  const gpu = page.getByTestId("gpu").first();
  await expect(gpu.getByTestId("gpu-total")).toHaveText("8 GB");
  await expect(gpu.getByTestId("gpu-offered")).toHaveText("7 GB");
  await expect(gpu.getByTestId("gpu-outside")).toHaveText("1 GB");
  await expect(gpu.getByTestId("gpu-offer")).toHaveText("Offers 7 of its 8 GB (1 GB held outside Tessera)");
  await expect(gpu.getByTestId("gpu-sharers")).toHaveText("shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken");
  await expect(gpu.getByTestId("memory-bar").locator("rect")).toHaveCount(4);
  await expect(page.locator('tr[data-worker="listen"]').getByTestId("worker-gpus")).toHaveText("1 · shared 2.2 GB");
  await expect(page.locator('tr[data-worker="voice"]').getByTestId("worker-gpus")).toHaveText("1 · shared 4.2 GB");
  await expect(page.getByTestId("pending-reason")).toHaveText("GPU 0 of majin: 6.4 of 7 GB taken by shared work; it needs 1.5");
  await page.screenshot({ path: test.info().outputPath("machine-majin.png"), fullPage: true });
});

test("an H200's page shows the MIG layout its sharers would take, and what must stop before it is made", async ({ page, request }) => {
  for (const [name, gb] of [["small-llm", 45], ["embedder", 8]] as const) {
    const r = await request.post("/api/workers", {
      data: { name, requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: gb, ids: ["h200-node:0"] } } },
    });
    expect(r.status(), await r.text()).toBe(201);
  }
  // Eight GPUs are tiles at a glance; a tile opens its GPU's detail.
  await open(page, "/machines/h200-node");
  await expect(page.getByTestId("gpu-tile")).toHaveCount(8);
  await expect(page.locator('[data-testid="gpu-tile"][data-index="0"]').getByTestId("gpu-tile-taken")).toHaveText("53 GB of 141 GB taken");
  await page.locator('[data-testid="gpu-tile"][data-index="0"]').getByRole("link").click();
  await expect(page).toHaveURL(/\/machines\/h200-node\?gpu=0#gpu-0$/);
  const gpu = page.locator('[data-testid="gpu"][data-index="0"]');
  await gpu.getByText("Under MIG: each model in an instance of its own").click();
  await expect(gpu.getByTestId("mig-instance")).toHaveText([
    "small-llm on 3g.71gb (slices 0–3, 69.8 GB)",
    "embedder on 1g.18gb (slices 4–4, 16 GB)",
  ]);
  await expect(gpu.getByTestId("mig-stop-first")).toHaveText(
    "A layout is made on an idle GPU, with MIG mode on (which may reset it): embedder, small-llm must stop first.",
  );
  await expect(gpu.getByTestId("gpu-sharing")).toHaveText("Time-sliced: each share is a promise the engine keeps by sizing itself.");
});

test("an operator puts an H200 under MPS from its page: the confirmation names its sharers, which restart held to their shares", async ({ page, request }) => {
  for (const [name, gb] of [["small-llm", 45], ["embedder", 8]] as const) {
    const r = await request.post("/api/workers", {
      data: { name, requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: gb, ids: ["h200-node:2"] } } },
    });
    expect(r.status(), await r.text()).toBe(201);
  }
  await open(page, "/machines/h200-node");
  const gpu = page.locator('[data-testid="gpu"][data-index="2"]');
  const form = page.getByTestId("sharing-form");
  await form.getByTestId("sharing-gpu").selectOption("2");
  await form.getByTestId("sharing-mode").selectOption("mps");
  await form.getByTestId("sharing-compute").fill("0");
  await expect(form.getByRole("alert")).toHaveText("a compute share is a whole percent from 1 to 100, not 0");
  await expect(form.getByTestId("sharing-apply")).toBeDisabled();
  await form.getByTestId("sharing-compute").fill("50");
  await form.getByTestId("sharing-apply").click();
  await expect(form.getByTestId("confirm-restarts")).toHaveText("This restarts 2 models: embedder, small-llm.");
  await form.getByTestId("confirm").getByRole("button", { name: "Apply" }).click();
  await expect(form.getByTestId("sharing-done")).toHaveText(
    "h200-node:2 is shared under MPS; restarting embedder, small-llm, each stopped before it starts again.",
  );
  await expect(gpu.getByTestId("gpu-sharing")).toHaveText(
    "MPS: the driver holds each engine to its memory share. Each engine may use at most 50 % of its compute. This GPU is made up, so no daemon runs: the demo engines stand in.",
  );
  // The other GPUs are as they were, and the change is in the audit log with what restarted.
  await expect(page.locator('[data-testid="gpu"][data-index="3"]').getByTestId("gpu-sharing")).toHaveCount(0);
  const audit = await (await request.get("/api/audit?action=gpu.sharing")).json();
  expect(audit[0].restarts).toEqual(["embedder", "small-llm"]);
  await page.screenshot({ path: test.info().outputPath("machine-mps.png"), fullPage: true });
});

test("an operator cuts an idle H200 into MIG instances from its page: each is a GPU of its own held whole, and it joins back once idle", async ({ page, request }) => {
  await open(page, "/machines/h200-node");
  const form = page.getByTestId("sharing-form");
  await form.getByTestId("sharing-gpu").selectOption("4");
  await form.getByTestId("sharing-mode").selectOption("mig");
  // Judged live against the H200's menu, by the rule the server cuts by.
  await form.getByTestId("sharing-instances").fill("4g.71gb, 4g.71gb");
  await expect(form.getByTestId("sharing-layout-error")).toHaveText(
    "An H200 141GB has 7 compute and 8 memory slices (and at most 7 instances); these take 8 and 8: 4g.71gb (4+4), 4g.71gb (4+4), each as compute+memory.",
  );
  await expect(form.getByTestId("sharing-apply")).toBeDisabled();
  await form.getByTestId("sharing-instances").fill("1g.18gb, 3g.71gb, 1g.18gb");
  await expect(form.getByTestId("sharing-layout").locator("li")).toHaveText([
    "3g.71gb (slices 0–3, 69.8 GB)",
    "1g.18gb (slices 4–4, 16 GB)",
    "1g.18gb (slices 5–5, 16 GB)",
  ]);
  await form.getByTestId("sharing-apply").click();
  await expect(form.getByTestId("confirm")).toContainText("Cut GPU 4 into these MIG instances?");
  await form.getByTestId("confirm").getByRole("button", { name: "Apply" }).click();
  await expect(form.getByTestId("sharing-done")).toHaveText("h200-node:4 is cut into MIG instances, each a GPU of its own held whole.");

  const cut = page.locator('[data-testid="gpu"][data-index="4"]');
  await expect(cut.getByTestId("gpu-mig")).toHaveText(
    "Cut into MIG instances: work runs in those, each a GPU of its own below, and none on this GPU itself.",
  );
  await expect(cut.getByTestId("gpu-offer")).toHaveText("Offers nothing itself: its 141 GB are its MIG instances'");
  // Its instances follow it, before GPU 5.
  await expect(page.getByTestId("gpu").nth(5)).toHaveAttribute("data-index", "5000");
  await expect(page.getByTestId("gpu").nth(8)).toHaveAttribute("data-index", "5");
  const instance = page.locator('[data-testid="gpu"][data-index="5001"]');
  await page.locator('[data-testid="gpu-tile"][data-index="5001"]').getByRole("link").click();
  await expect(instance.getByRole("heading")).toHaveText("MIG instance 1 of GPU 4 · NVIDIA H200 MIG 1g.18gb");
  await expect(instance.getByTestId("gpu-total")).toHaveText("16 GB");
  await expect(instance.getByTestId("gpu-mig")).toHaveText("A MIG instance, with memory and compute walls of its own: one engine holds it whole.");

  // The Nodes tab counts the cut GPU as its three instances, which are not shared.
  await open(page, "/nodes");
  await expect(page.locator('tr[data-node="h200-node"]').getByTestId("node-memory")).toContainText("7 of 10 shareable · 987 GB free");
  await open(page, "/machines/h200-node");

  // An engine takes an instance whole; while it runs there, the GPU is not joined back.
  const asr = await request.post("/api/workers", {
    data: { name: "asr", requested_resources: { gpu_requests: { count: 1, shared: false, ids: ["h200-node:5001"] } } },
  });
  expect(asr.status(), await asr.text()).toBe(201);
  await expect(instance.getByTestId("gpu-usage")).toHaveText("Held whole by asr.");
  await form.getByTestId("sharing-gpu").selectOption("4");
  await form.getByTestId("sharing-mode").selectOption("time-slicing");
  await form.getByTestId("sharing-apply").click();
  await expect(form.getByTestId("confirm")).toContainText("Join GPU 4 back whole?");
  await form.getByTestId("confirm").getByRole("button", { name: "Apply" }).click();
  await expect(form.getByTestId("sharing-error")).toHaveText(
    "GPU 4 of h200-node runs asr: a GPU is cut into MIG instances, or joined back, only while nothing runs on it; remove or move it first",
  );
  await page.screenshot({ path: test.info().outputPath("machine-mig.png"), fullPage: true });

  expect((await request.delete("/api/workers/asr")).status()).toBe(204);
  await form.getByTestId("sharing-apply").click();
  await form.getByTestId("confirm").getByRole("button", { name: "Apply" }).click();
  await expect(form.getByTestId("sharing-done")).toHaveText("h200-node:4 is shared time-sliced; nothing restarts.");
  await expect(page.locator('[data-testid="gpu"][data-index="5001"]')).toHaveCount(0);
  await expect(cut.getByTestId("gpu-mig")).toHaveCount(0);
});
