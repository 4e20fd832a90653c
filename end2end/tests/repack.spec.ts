// Repack (seed 001): the plan shown whole before anything changes, worked out in the browser, then carried
// out one move at a time until the GPU it promised is free.
import { expect, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

/** atlas's two 96 GB GPUs each hold one worker, as best fit left them once a large worker ended. */
async function fragment(request: import("@playwright/test").APIRequestContext): Promise<void> {
  for (const [name, gb] of [["big", 60], ["chat", 40], ["embed", 20]] as const) {
    const r = await request.post("/api/workers", {
      data: { name, requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: gb } } },
    });
    expect(r.status(), await r.text()).toBe(201);
  }
  expect((await request.delete("/api/workers/big")).status()).toBe(204);
}

test("the repack plan shows each move, its restarts and the GPUs it frees, then frees them when carried out", async ({ page, request }) => {
  await fragment(request);
  await open(page, "/repack");
  await expect(page.getByTestId("repack-summary")).toHaveText("Frees 1 GPU: GPU 0 of atlas — 1 move, 1 restart.");
  const move = page.locator('tr[data-unit="embed"]');
  await expect(move.getByTestId("repack-to")).toHaveText("GPU 1 of atlas");
  await expect(page.getByTestId("repack-step")).toHaveText(["Stop embed on GPU 0 of atlas", "Start embed on GPU 1 of atlas"]);
  const atlas0 = page.locator('tr[data-gpu="atlas:0"]');
  await expect(atlas0.getByTestId("repack-before")).toHaveText("embed — 20 of 96 GB");
  await expect(atlas0.getByTestId("repack-after")).toHaveText("free (96 GB)");
  await page.screenshot({ path: test.info().outputPath("repack-plan.png"), fullPage: true });

  // Asked for more than memory allows, the plan says how many it could free, as the browser works it out.
  await page.getByLabel("GPUs to free").fill("3");
  await expect(page.getByTestId("repack-refused")).toHaveText("No repack frees 3 GPUs: by memory, at most 1 can be freed.");
  await page.getByLabel("GPUs to free").fill("");

  // Counting right-sized shares needs a day of measured peaks; the demo's engines have none yet.
  await page.getByTestId("right-sized").check();
  await expect(page.getByTestId("right-sized-line")).toHaveText(
    "No model has yet run a day well below its share, so there is nothing to right-size.",
  );
  await page.getByTestId("right-sized").uncheck();
  await expect(page.getByTestId("right-sized-line")).toHaveCount(0);

  await page.getByTestId("repack-start").click();
  await expect(page.getByRole("heading", { name: "Carry out this repack?" })).toBeVisible();
  await page.getByTestId("confirm").getByRole("button", { name: "Carry out" }).click();
  await expect(page.getByTestId("repack-run")).toHaveAttribute("data-state", "done");
  await expect(page.getByTestId("repack-progress")).toHaveAttribute("data-status", "done");
  await expect(page.getByTestId("repack-summary")).toHaveText("Nothing to gain: no repack frees a GPU here.");
  const embed = await (await request.get("/api/workers/embed")).json();
  expect([embed.machine, embed.gpus]).toEqual(["atlas", [1]]);
  const moves = await (await request.get("/api/audit?action=repack.move")).json();
  expect(moves.map((e: any) => e.target)).toEqual(["embed"]);
});
