// What changes on the server shows without a reload: the runtime's event stream moves the page.
import { deploy, expect, test } from "./fixtures/tessera";
import { open, ModelsTab } from "./fixtures/console";

// The demo engines take 4 s to "load", so the page sees them start.
test.use({ engineStartMs: 4000 });

test("a model becomes healthy on the Models tab without a reload", async ({ page, request }) => {
  await open(page, "/models");
  let navigations = 0;
  page.on("framenavigated", () => navigations++);
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  const row = new ModelsTab(page).row("glm-5.3");
  await expect(row.getByTestId("state")).toHaveText("Starting");
  await expect(row.getByTestId("health")).toHaveText("0/1 healthy");
  await expect(row.getByTestId("health")).toHaveText("1/1 healthy", { timeout: 20_000 });
  await expect(row.getByTestId("state")).toHaveText("Serving");
  expect(navigations, "the page was not reloaded").toBe(0);
});

test("a restart's progress shows step by step, and goes when it is done", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "vision", gpus: ["atlas:0"], share: 25, revision: 1 });
  await open(page, "/models");
  await expect(new ModelsTab(page).row("vision").getByTestId("health")).toHaveText("1/1 healthy", { timeout: 20_000 });
  const changed = await request.put("/api/groups/text-router/plan", {
    data: { revision: 2, shares: { "glm-5.3": 30, vision: 35 } },
  });
  expect(changed.status()).toBe(200);
  const change = page.getByTestId("changes").locator('[data-group="text-router"]');
  await expect(change.getByRole("heading")).toHaveText("Restarting text-router (revision 3)");
  await expect(change.getByTestId("step-line").first()).toHaveText("Stop glm-5.3: done");
  await expect(change.getByTestId("step-line").nth(3)).toHaveText("Start vision: waiting");
  await page.screenshot({ path: test.info().outputPath("restart-in-progress.png"), fullPage: true });
  await expect(change).toHaveCount(0, { timeout: 30_000 });
  await expect(new ModelsTab(page).row("vision").getByTestId("share")).toHaveText("35%");
});
