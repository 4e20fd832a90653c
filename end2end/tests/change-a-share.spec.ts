// Seed 003, "Change a Running Model's GPU Memory Share", and the Serving configuration beside it.
import AxeBuilder from "@axe-core/playwright";
import { deploy, expect, healthy, test } from "./fixtures/tessera";
import { FITS, ModelsTab, open, OVER, SharePanel } from "./fixtures/console";

test.beforeEach(async ({ request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "semantic-router", gpus: ["atlas:0"], share: 10, revision: 1 });
  await deploy(request, { model: "vision", gpus: ["atlas:0"], share: 25, revision: 2 });
});

test("the form opens on today's shares, Save waits for a change, and the confirmation shows each share's change in memory and names who restarts", async ({ page, request }) => {
  await open(page, "/models");
  const models = new ModelsTab(page);
  await models.menu("vision", "GPU sharing");
  await expect(page).toHaveURL(/\/models\/vision\/sharing$/);
  await expect(page.locator('[data-hydrated="true"]').first()).toBeVisible();
  const panel = new SharePanel(page);
  const save = page.getByRole("button", { name: "Save" });
  await expect(panel.share("glm-5.3")).toHaveValue("40");
  await expect(panel.share("vision")).toHaveValue("25");
  await expect(panel.verdict).toHaveText(FITS("75%"));
  await expect(save).toBeDisabled();

  // The router's row is marked not editable and keeps its share.
  const router = panel.share("semantic-router");
  await expect(router).toHaveAttribute("readonly", "");
  await expect(page.getByTestId("not-editable")).toHaveText("not editable");
  await router.pressSequentially("99");
  await expect(router).toHaveValue("10");
  await expect(save).toBeDisabled();

  await panel.type("vision", "70");
  await expect(panel.verdict).toHaveText(OVER);
  await expect(save).toBeDisabled();
  await panel.type("vision", "25");
  await expect(save).toBeDisabled();

  await panel.type("vision", "30");
  await panel.type("glm-5.3", "35");
  await expect(save).toBeEnabled();
  await page.screenshot({ path: test.info().outputPath("gpu-sharing-form.png"), fullPage: true });
  await save.click();
  // The change itself, share and memory, before who restarts.
  await expect(page.getByTestId("confirm-changes").locator("li")).toHaveText(["glm-5.3 40% → 35% (38.4 → 33.6 GB)", "vision 25% → 30% (24 → 28.8 GB)"]);
  await expect(page.getByTestId("confirm-restarts")).toHaveText("This restarts 2 models: glm-5.3, vision.");
  await page.getByTestId("confirm").getByRole("button", { name: "Save" }).click();

  await expect(page.getByTestId("notice")).toHaveText("Saved. glm-5.3 and vision restart with their new settings.");
  await expect(models.row("vision").getByTestId("share")).toHaveText("30%");
  await expect(models.row("glm-5.3").getByTestId("share")).toHaveText("35%");
  await expect(models.row("semantic-router").getByTestId("share")).toHaveText("10%");
  // Only the two whose share changed restart, growing after shrinking (placement's order).
  const progress = async () => {
    const group = await (await request.get("/api/groups/text-router")).json();
    return [group.revision, group.progress.steps.map((s: any) => `${s.action} ${s.member} ${s.status}`)];
  };
  await expect
    .poll(progress, { timeout: 20_000 })
    .toEqual([4, ["stop glm-5.3 done", "start glm-5.3 done", "stop vision done", "start vision done"]]);
  await expect(models.row("vision").getByTestId("health")).toHaveText("1/1 healthy");
});

test("a right-sized share offered on the Models tab opens the form with it proposed, judged and confirmed like any change, beside the model's memory estimate, which offers no inputs where it can make none", async ({ page }) => {
  // What the Models tab's "Right-size to 20 %" opens.
  await open(page, "/models/vision/sharing?share=20");
  await expect(page.locator('[data-hydrated="true"]').first()).toBeVisible();
  const panel = new SharePanel(page);
  await expect(panel.share("vision")).toHaveValue("20");
  await expect(panel.share("glm-5.3")).toHaveValue("40");
  await expect(panel.verdict).toHaveText(FITS("70%"));
  // The estimate reads the model's file on the server; the demo's is not there, and it says so.
  // One panel per member of its group, the opened model's first.
  const panels = page.getByTestId("estimate-panel");
  await expect(panels.first()).toHaveAttribute("data-model", "vision");
  await expect(page.locator('[data-testid="estimate-panel"][data-model="glm-5.3"]')).toBeVisible();
  await expect(page.getByRole("heading", { name: "Memory estimate: vision" })).toBeVisible();
  await expect(panels.first().getByTestId("no-estimate")).toContainText("No estimate:");
  // With no estimate possible, no inputs that would change nothing; each engine's own words; a cache type
  // only where the engine takes one from here (llama.cpp), none for a command recipe.
  await expect(panels.first().getByText("Context per sequence")).toBeHidden();
  const glm = page.locator('[data-testid="estimate-panel"][data-model="glm-5.3"]');
  await expect(glm.locator("label", { hasText: "Parallel sequences" })).toHaveCount(1);
  await expect(glm.getByText("Cache type")).toHaveCount(0);
  await expect(page.locator('[data-testid="estimate-panel"][data-model="semantic-router"]').getByTestId("estimate-command")).toBeVisible();
  const save = page.getByRole("button", { name: "Save" });
  await expect(save).toBeEnabled();
  await save.click();
  await expect(page.getByTestId("confirm-restarts")).toHaveText("This restarts vision.");
  await page.getByTestId("confirm").getByRole("button", { name: "Save" }).click();
  await expect(page.getByTestId("notice")).toHaveText("Saved. vision restarts with its new settings.");
  await expect(new ModelsTab(page).row("vision").getByTestId("share")).toHaveText("20%");
});

test("a plan changed by someone else first is refused, and the form says to read it again", async ({ page, request }) => {
  await open(page, "/models/vision/sharing");
  const panel = new SharePanel(page);
  await expect(page.locator('[data-hydrated="true"]').first()).toBeVisible();
  const changed = await request.put("/api/groups/text-router/plan", {
    data: { revision: 3, shares: { "glm-5.3": 40, "semantic-router": 10, vision: 20 } },
  });
  expect(changed.status()).toBe(200);
  await panel.type("vision", "30");
  await page.getByRole("button", { name: "Save" }).click();
  await page.getByTestId("confirm").getByRole("button", { name: "Save" }).click();
  await expect(page.getByTestId("save-error")).toContainText("group text-router is at revision 4, not 3");
  const group = await (await request.get("/api/groups/text-router")).json();
  expect(group.members.find((m: any) => m.name === "vision").share_percent).toBe(20);
});

test("the serving configuration opens on the placement the model has, and a change restarts that model alone", async ({ page, request }) => {
  // majin's only GPU is shared out: no free GPU is left there, and vision's placement still shows.
  await deploy(request, { model: "speech", gpus: ["majin:0"], share: 50 });
  await open(page, "/models");
  const models = new ModelsTab(page);
  await models.menu("speech", "Serving configuration");
  await expect(page).toHaveURL(/\/models\/speech\/serving$/);
  await expect(page.locator('[data-hydrated="true"]').first()).toBeVisible();
  await expect(page.locator("#node-majin")).toBeChecked();
  await expect(page.locator("#node-atlas")).not.toBeChecked();
  await expect(page.getByLabel("GPU width")).toHaveValue("1");
  const save = page.getByRole("button", { name: "Save" });
  await expect(save).toBeDisabled();
  const before = (await (await request.get("/api/engines")).json()).find((e: any) => e.model === "glm-5.3").pid;
  await page.getByLabel("Environment variables").fill("LLAMA_ARG_CTX_SIZE=4096");
  await expect(save).toBeEnabled();
  await save.click();
  await expect(page.getByTestId("confirm-restarts")).toHaveText("This restarts speech.");
  await page.getByTestId("confirm").getByRole("button", { name: "Save" }).click();
  await expect(page.getByTestId("notice")).toHaveText("Saved. speech restarts with its new settings.");
  await expect(models.row("speech").getByTestId("health")).toHaveText("1/1 healthy");
  const engines = await (await request.get("/api/engines")).json();
  expect(engines.find((e: any) => e.model === "glm-5.3").pid, "the others keep running").toBe(before);
});

test("a model has one colour on every page, the sharing form's bar and the machine's alike, with a legend under each bar", async ({ page }) => {
  await open(page, "/models/vision/sharing");
  const colourOf = async (locator: ReturnType<typeof page.locator>) =>
    ((await locator.getAttribute("class")) ?? "").split(" ").find((c) => /^s\d+$/.test(c));
  const formColours: Record<string, string | undefined> = {};
  for (const model of ["glm-5.3", "vision"]) {
    formColours[model] = await colourOf(page.getByTestId("share-row").filter({ hasText: model }).locator(".swatch"));
    expect(formColours[model]).toBeDefined();
  }
  await open(page, "/machines/atlas?gpu=0");
  const bar = page.getByTestId("memory-bar").first();
  for (const model of ["glm-5.3", "vision"]) {
    const segment = bar.locator("rect.seg").filter({ has: page.locator(`title:text-matches("^${model} ")`) });
    expect(await colourOf(segment)).toBe(formColours[model]);
  }
  await expect(page.getByTestId("memory-legend").first()).toContainText("glm-5.3");
  await expect(page.getByTestId("memory-legend").first()).toContainText("left");
});

test("a model's own page, from its name on the Models tab, shows its engines, restarts, errors, neighbours, log and its group's last change", async ({ page, request }) => {
  await healthy(request, "vision");
  await open(page, "/models");
  await new ModelsTab(page).row("vision").getByRole("link", { name: "vision" }).click();
  await expect(page).toHaveURL(/\/models\/vision$/);
  await expect(page).toHaveTitle("vision · Tessera");
  await expect(page.getByRole("heading", { name: "vision", level: 1 })).toBeVisible();
  await expect(page.getByTestId("model-placement")).toHaveText("25% of each GPU of text-router, on atlas");
  await expect(page.getByTestId("model-state")).toHaveText("Serving");
  await expect(page.getByTestId("model-restarts")).toHaveText("0");
  await expect(page.getByTestId("model-errors")).toHaveText("—");
  await expect(page.getByTestId("model-neighbours")).toHaveText(/^Shares its GPUs with: (glm-5\.3, semantic-router|semantic-router, glm-5\.3)\.$/);
  await expect(page.getByTestId("model-engine")).toHaveCount(1);
  await expect(page.getByTestId("model-log-engine")).toHaveText("From its engine on atlas: Serving.");
  await expect(page.getByTestId("model-logs")).toContainText("serving on");
  await expect(page.getByTestId("model-change").locator("li").last()).toContainText("Start vision");
  const violations = (await new AxeBuilder({ page }).analyze()).violations.filter(
    (v) => v.impact === "serious" || v.impact === "critical",
  );
  expect(violations.map((v) => v.id)).toEqual([]);
  await page.screenshot({ path: test.info().outputPath("model-page.png"), fullPage: true });
  await open(page, "/models/nothing-like-it");
  await expect(page.getByRole("alert")).toContainText("no model named nothing-like-it is deployed");
});
