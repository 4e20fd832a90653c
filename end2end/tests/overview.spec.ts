// The Overview, the console's landing page: the fleet's GPUs and memory, its models, the gateway's hour, and
// every open alarm as a link to where it is dealt with.
import { deploy, expect, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test("the overview sums the fleet, counts the models, and leads from a fragment of free memory to the repack", async ({ page, request }) => {
  await open(page, "/");
  await expect(page.getByRole("heading", { name: "Overview" })).toBeVisible();
  // The demo fleet: majin, studio (2 GPUs), atlas (2) and the 8-GPU h200-node, nothing deployed.
  await expect(page.getByTestId("machines")).toHaveText("4");
  await expect(page.getByTestId("gpus")).toHaveText("13");
  await expect(page.getByTestId("no-alarms")).toHaveText("No alarms.");
  await expect(page).toHaveTitle("Overview · Tessera");
  await expect(page.getByTestId("models-line")).toHaveText("0 models: 0 serving, 0 loading, 0 not loaded, 0 failing");

  // A model on 40 % of atlas:0: that GPU is partly taken, and its free room is a fragment.
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await expect(page.getByTestId("models-line")).toContainText("1 model: ");
  await expect(page.getByTestId("shared")).toHaveText(/^38\.4 GB \(\d+%\)$/);
  await expect(page.getByTestId("stranded")).toContainText("57.6 GB of the free memory lies in fragments");
  await page.getByTestId("stranded").getByRole("link", { name: "Repack" }).click();
  await expect(page).toHaveURL(/\/repack$/);

  // The Models tab finds a model by name, group or node, and says which of how many it shows.
  await open(page, "/models");
  await expect(page.getByTestId("models-page")).toHaveText("Page 1 of 1 · model 1 of 1");
  await expect(page.getByTestId("memory")).toHaveText("—");
  await page.getByTestId("models-search").fill("nothing-like-it");
  await expect(page.getByTestId("no-match")).toHaveText('No model, group or node holds "nothing-like-it".');
  await page.getByTestId("models-search").fill("ATLAS");
  await expect(page.getByTestId("model-row")).toHaveCount(1);
  await expect(page).toHaveURL(/\/models\?q=ATLAS$/);
});

test("a worker that waits for room is an alarm with its reason, counted in the title, until it is placed", async ({ page, request }) => {
  const worker = (name: string) => ({ name, requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: 6, ids: ["majin:0"] } } });
  expect((await request.post("/api/workers", { data: worker("first") })).status()).toBe(201);
  expect((await request.post("/api/workers", { data: worker("second") })).status()).toBe(201);
  await open(page, "/");
  const alarm = page.locator('[data-testid="alarm"][data-kind="Waiting"]');
  await expect(alarm).toHaveText("Waiting second waits for room: GPU 0 of majin: 6 of 7 GB taken by shared work; it needs 6 (and 1 more reason)");
  await expect(page).toHaveTitle("(1) Overview · Tessera");
  await expect(alarm.getByRole("link")).toHaveAttribute("href", "/nodes");
  expect((await request.delete("/api/workers/first")).status()).toBeLessThan(300);
  await expect(page.getByTestId("no-alarms")).toHaveText("No alarms.");
});

test.describe("with a GPU whose reading says it is unhealthy", () => {
  test.use({
    inventory: [
      "[[machine]]", 'name = "sick"', "cpu_cores = 8", "memory_gb = 64",
      "[[machine.gpu]]", "index = 0", 'uuid = "GPU-sick-0"', 'model = "NVIDIA L4"', "memory_gb = 24", "healthy = false",
    ].join("\n") + "\n",
  });

  test("the overview raises an alarm for an unhealthy GPU, even one whose reading says not why, linked to its machine and counted in the tab's title, whose tile says it takes no work", async ({ page }) => {
    await open(page, "/");
    const alarm = page.locator('[data-testid="alarm"][data-kind="Unhealthy"]');
    await expect(alarm).toHaveText("Unhealthy GPU 0 of sick is unhealthy: its reading says so");
    await expect(page.getByTestId("no-alarms")).toHaveCount(0);
    // Counted in the tab's title, so that a tab in the background says so.
    await expect(page).toHaveTitle(/^\(\d+\) Overview · Tessera$/);
    await alarm.getByRole("link").click();
    await expect(page).toHaveURL(/\/machines\/sick$/);
    // Not "free · offers 24 GB": nothing is placed on it.
    await expect(page.getByTestId("gpu-tile-taken")).toHaveText("unhealthy: takes no work");
  });

  test("the nodes tab pictures each node's GPUs, marks the unhealthy, and sorts by health, free memory and GPU model", async ({ page }) => {
    await open(page, "/nodes");
    const sick = page.locator('[data-testid="node-row"][data-node="sick"]');
    await expect(sick.getByTestId("node-unhealthy")).toHaveText("1 unhealthy");
    await expect(sick.getByTestId("gpu-cells")).toHaveAttribute("aria-label", "1 GPU: 0 whole, 0 shared, 0 free; 1 unhealthy");
    await expect(sick.getByTestId("node-gpu-model")).toHaveText("NVIDIA L4");
    await page.getByTestId("sort-health").click();
    await expect(page).toHaveURL(/\/nodes\?sort=health$/);
    await expect(page.getByTestId("node-row").first()).toHaveAttribute("data-node", "sick");
    await expect(page.getByRole("columnheader", { name: /GPUs/ })).toHaveAttribute("aria-sort", "descending");
    await page.getByTestId("sort-free").click();
    await expect(page).toHaveURL(/\/nodes\?sort=free$/);
    // h200-node's eight 141 GB GPUs hold the most free memory of the demo fleet.
    await expect(page.getByTestId("node-row").first()).toHaveAttribute("data-node", "h200-node");
    await page.getByTestId("sort-gpu").click();
    await expect(page.getByTestId("node-row").first().getByTestId("node-gpu-model")).toHaveText(/^NVIDIA/);
  });
});
