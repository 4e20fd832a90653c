// Seed 002's hybrid: a member put on demand in the GPU sharing form takes turns in what the pinned ones
// leave, unloads after its keep-alive with no request, and loads again on the first request through /v1.
import { deploy, expect, test } from "./fixtures/tessera";
import { FITS, ModelsTab, open, SharePanel } from "./fixtures/console";

test.beforeEach(async ({ request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "semantic-router", gpus: ["atlas:0"], share: 10, revision: 1 });
  await deploy(request, { model: "vision", gpus: ["atlas:0"], share: 25, revision: 2 });
});

test("a member put on demand takes turns, unloads after its keep-alive, and loads on its next request", async ({ page, request }) => {
  await open(page, "/models/vision/sharing");
  const panel = new SharePanel(page);
  const save = page.getByRole("button", { name: "Save" });
  await page.getByLabel("Load vision on demand").check();
  await expect(panel.verdict.locator("li")).toHaveText([
    FITS("75%"),
    "On-demand models take turns in the 50% the pinned ones leave.",
  ]);
  const keepAlive = page.getByLabel("Keep-alive of vision with no request, seconds");
  await keepAlive.fill("5");
  await expect(page.getByText("A keep-alive is a whole number of seconds from 10 to 604800 (a week).")).toBeVisible();
  await expect(save).toBeDisabled();
  await keepAlive.fill("10");
  await expect(save).toBeEnabled();
  await save.click();
  // It keeps its engine until its keep-alive runs out: nothing restarts.
  await expect(page.getByTestId("confirm-restarts")).toHaveText("Nothing restarts.");
  await page.getByTestId("confirm").getByRole("button", { name: "Save" }).click();

  const row = new ModelsTab(page).row("vision");
  await expect(row.getByTestId("on-demand")).toContainText("On demand, unloaded after 10 s idle:");
  await expect(row.getByTestId("on-demand")).toContainText("not loaded", { timeout: 30_000 });
  await expect(row.getByTestId("state")).toContainText("not loaded: the next request loads it");

  const answer = await request.post("/v1/chat/completions", {
    data: { model: "vision", messages: [{ role: "user", content: "hello" }] },
  });
  expect(answer.status(), await answer.text()).toBe(200);
  // The page refreshes on the engine's events; the cold start is known once the request has its engine.
  await open(page, "/models");
  await expect(row.getByTestId("on-demand")).toContainText(/: loaded; last used .*; last cold start \d+\.\d s\./);
  await expect(row.getByTestId("health")).toHaveText("1/1 healthy");
});
