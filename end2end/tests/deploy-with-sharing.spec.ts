// Seed 003, "Deploy a Model That Shares a GPU": the wizard from the Models tab to a healthy model.
import { deploy, expect, healthy, test } from "./fixtures/tessera";
import { FITS, ModelsTab, OVER, Wizard } from "./fixtures/console";

test("a model joins the running group, another member gives up room, and the model serves", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "semantic-router", gpus: ["atlas:0"], share: 10, revision: 1 });

  const wizard = new Wizard(page);
  await wizard.open();
  await expect(page.getByRole("heading", { name: "Deploy a model" })).toBeVisible();
  await expect(wizard.step).toHaveText("Model and placement");
  // A group runs, so the wizard starts with sharing on and offers nodes whose GPUs are in use.
  await expect(page.getByText("GPU sharing is on, so a node whose GPUs are all in use can be chosen too.")).toBeVisible();
  await wizard.page.getByLabel("Model", { exact: true }).selectOption("vision");
  await page.locator("#node-atlas").check();
  await wizard.next.click();
  await expect(wizard.step).toHaveText("Serving");
  await page.getByLabel("Extra arguments").fill("--max-model-len 8192");
  await page.getByLabel("Environment variables").fill("VLLM_LOGGING_LEVEL=INFO");
  await wizard.next.click();

  await expect(wizard.step).toHaveText("GPU sharing");
  await expect(page.getByRole("switch", { name: "GPU sharing" })).toBeChecked();
  await expect(wizard.groupLine).toHaveText("This model joins text-router.");
  await expect(wizard.panel.share("glm-5.3")).toHaveValue("40");
  await expect(wizard.panel.share("vision")).toHaveValue("25");
  await expect(wizard.panel.verdict).toHaveText(FITS("75%"));

  await wizard.panel.type("vision", "35");
  await wizard.panel.type("glm-5.3", "30");
  await expect(wizard.panel.verdict).toHaveText(FITS("75%"));
  await page.screenshot({ path: test.info().outputPath("deploy-gpu-sharing.png"), fullPage: true });

  await wizard.deploy.click();
  await expect(wizard.confirm).toBeVisible();
  await expect(page.getByTestId("confirm-changes").locator("li")).toHaveText(["glm-5.3 40% → 30% (38.4 → 28.8 GB)", "vision joins at 35% (33.6 GB)"]);
  await expect(page.getByTestId("confirm-restarts")).toHaveText("This restarts 2 models: glm-5.3, vision.");
  await page.screenshot({ path: test.info().outputPath("deploy-confirmation.png"), fullPage: true });
  await wizard.confirm.getByRole("button", { name: "Deploy" }).click();

  await expect(page).toHaveURL(/\/models\?deployed=vision$/);
  await expect(page.getByTestId("notice")).toHaveText(/^vision is (being deployed|deployed and serving)\.$/);
  const models = new ModelsTab(page);
  await expect(models.row("vision").getByTestId("group")).toHaveText("text-router");
  await expect(models.row("vision").getByTestId("share")).toHaveText("35%");
  await expect(models.row("glm-5.3").getByTestId("share")).toHaveText("30%");
  await expect(models.row("vision").getByTestId("health")).toHaveText("1/1 healthy");
  await expect(models.row("vision").getByTestId("state")).toHaveText("Serving");
  // The banner keeps up with the row: no "being deployed" beside Serving.
  await expect(page.getByTestId("notice")).toHaveText("vision is deployed and serving.");
  await page.screenshot({ path: test.info().outputPath("models-after-deploy.png"), fullPage: true });

  const group = await (await request.get("/api/groups/text-router")).json();
  expect(group.members.map((m: any) => [m.name, m.share_percent])).toEqual([
    ["glm-5.3", 30],
    ["semantic-router", 10],
    ["vision", 35],
  ]);
  const engine = (await (await request.get("/api/engines")).json()).find((e: any) => e.model === "vision");
  expect(engine.command).toContain("--max-model-len");
});

test("with no group running, the model starts one named after it and the router moves in", async ({ page, request }) => {
  await deploy(request, { model: "semantic-router", gpus: ["atlas:0"], share: 10 });
  const wizard = new Wizard(page);
  await wizard.open();
  await wizard.place("vision", ["h200-node"]);
  await expect(wizard.groupLine).toHaveText("Tessera names the group after this model.");
  await expect(wizard.panel.share("semantic-router")).toHaveAttribute("readonly", "");
  await wizard.deploy.click();
  // The router restarts in the new group: the confirmation says so.
  await expect(page.getByTestId("confirm-restarts")).toHaveText("This restarts 2 models: semantic-router, vision.");
  await wizard.confirm.getByRole("button", { name: "Deploy" }).click();
  const models = new ModelsTab(page);
  await expect(models.row("vision").getByTestId("group")).toHaveText("vision");
  await expect(models.row("semantic-router").getByTestId("group")).toHaveText("vision");
  await expect(models.row("semantic-router").getByTestId("health")).toHaveText("1/1 healthy");
});

test("with sharing off, the model takes whole GPUs", async ({ page, request }) => {
  const wizard = new Wizard(page);
  await wizard.open();
  // No group runs: the wizard starts with sharing off, so only nodes with free GPUs count.
  await wizard.place("speech", ["h200-node"], 2);
  await expect(page.getByRole("switch", { name: "GPU sharing" })).not.toBeChecked();
  await expect(page.getByTestId("whole-line")).toHaveText("The model takes whole GPUs: GPU 0 of h200-node, GPU 1 of h200-node.");
  await wizard.deploy.click();
  const models = new ModelsTab(page);
  await expect(models.row("speech").getByTestId("share")).toHaveText("2 whole GPUs");
  await expect(models.row("speech").getByTestId("group")).toHaveText("—");
  await expect(models.row("speech").getByTestId("health")).toHaveText("1/1 healthy");
  const machine = await (await request.get("/api/machines/h200-node")).json();
  expect(machine.gpus.slice(0, 3).map((g: any) => g.mode)).toEqual(["whole", "whole", "free"]);
});

test("a removal is asked in a dialog over the table, the menu closed and Cancel first, and stops that model alone", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "speech", gpus: ["atlas:0"], share: 10, revision: 1 });
  // Both serving before the page is read, so that the rows are measured as they stay (a starting row
  // says more, and is taller).
  await healthy(request, "glm-5.3");
  await healthy(request, "speech");
  await page.goto("/models");
  const models = new ModelsTab(page);
  await expect(models.row("speech")).toBeVisible();
  await expect(page.locator('main[data-hydrated="true"]')).toHaveCount(1);
  const cells = await models.row("speech").locator("th, td").count();
  const rowHeight = (await models.row("speech").boundingBox())!.height;
  await models.menu("speech", "Remove");
  const dialog = page.getByRole("alertdialog");
  await expect(dialog).toContainText("Remove speech?");
  // A modal dialog: the menu shut behind it, the row as it was, the safe answer focused, Escape its way out.
  await expect(models.row("speech").locator("details.menu")).not.toHaveAttribute("open");
  expect(await dialog.evaluate((d) => d.tagName === "DIALOG" && (d as HTMLDialogElement).open && d.matches(":modal"))).toBe(true);
  await expect(models.row("speech").locator("th, td")).toHaveCount(cells);
  expect((await models.row("speech").boundingBox())!.height).toBe(rowHeight);
  await expect(dialog.getByRole("button", { name: "Cancel" })).toBeFocused();
  await expect(dialog.getByRole("button", { name: "Remove" })).toHaveClass(/danger/);
  await page.keyboard.press("Escape");
  await expect(dialog).toHaveCount(0);
  await expect(models.row("speech")).toBeVisible();
  await models.menu("speech", "Remove");
  await page.getByRole("alertdialog").getByRole("button", { name: "Remove" }).click();
  await expect(models.row("speech")).toHaveCount(0);
  await expect(models.row("glm-5.3").getByTestId("share")).toHaveText("40%");
});

test("a model deployed on demand from the wizard runs no engine until its first request", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "semantic-router", gpus: ["atlas:0"], share: 10, revision: 1 });
  const wizard = new Wizard(page);
  await wizard.open();
  await wizard.page.getByLabel("Model", { exact: true }).selectOption("vision");
  await page.locator("#node-atlas").check();
  await wizard.next.click();
  await wizard.next.click();
  await expect(wizard.step).toHaveText("GPU sharing");
  await page.getByLabel("Load vision on demand").check();
  await wizard.panel.type("vision", "50");
  await expect(wizard.panel.verdict.locator("li")).toHaveText([
    FITS("100%"),
    "On-demand models take turns in the 50% the pinned ones leave.",
  ]);
  await wizard.panel.type("vision", "51");
  await expect(wizard.panel.verdict).toHaveText(OVER);
  await expect(wizard.deploy).toBeDisabled();
  await wizard.panel.type("vision", "30");
  await wizard.deploy.click();

  await expect(page).toHaveURL(/\/models\?deployed=vision$/);
  const row = new ModelsTab(page).row("vision");
  await expect(row.getByTestId("on-demand")).toHaveText("On demand, unloaded after 300 s idle: not loaded.");
  await expect(row.getByTestId("state")).toContainText("not loaded: the next request loads it");
  const engines = await (await request.get("/api/engines")).json();
  expect(engines.map((e: any) => e.model)).not.toContain("vision");
});

test("the Serving step's example arguments are in the chosen engine's own flags, and a command recipe gets none", async ({ page }) => {
  const wizard = new Wizard(page);
  for (const [model, example] of [["glm-5.3", "--max-model-len 8192"], ["vision", "--context-length 8192"], ["speech", "--ctx-size 8192"], ["embedder", null]]) {
    await wizard.open();
    await page.getByLabel("Model", { exact: true }).selectOption(model!);
    await page.locator("#node-atlas").check();
    await wizard.next.click();
    await expect(wizard.step).toHaveText("Serving");
    const args = page.getByLabel("Extra arguments");
    if (example) await expect(args).toHaveAttribute("placeholder", example);
    else await expect(args).not.toHaveAttribute("placeholder");
  }
});

test("on a node that runs two groups the wizard lets one pick the group to join, and the model joins it on its GPU", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["h200-node:1"], share: 40 });
  await deploy(request, { model: "vision", gpus: ["h200-node:2"], share: 25 });
  const wizard = new Wizard(page);
  await wizard.open();
  await page.getByLabel("Model", { exact: true }).selectOption("speech");
  await page.locator("#node-h200-node").check();
  await expect(page.getByTestId("placement-problem")).toHaveText("The chosen nodes run 2 sharing groups: choose the one speech joins.");
  const pick = page.getByTestId("group-pick");
  await expect(pick.getByRole("radio")).toHaveCount(2);
  await pick.getByRole("radio", { name: /^vision · GPU 2 of h200-node/ }).check();
  await expect(page.getByTestId("placement-problem")).toHaveCount(0);
  await wizard.next.click();
  await expect(wizard.step).toHaveText("Serving");
  await wizard.next.click();
  await expect(wizard.step).toHaveText("GPU sharing");
  await expect(page.getByTestId("group-line")).toHaveText("This model joins vision.");
  await wizard.panel.type("speech", "20");
  // Nothing restarts (vision keeps its share), so nothing is asked.
  await wizard.deploy.click();
  await expect(page).toHaveURL(/deployed=speech/);
  const group = await (await request.get("/api/groups/vision")).json();
  expect(group.members.map((m: { name: string }) => m.name).sort()).toEqual(["speech", "vision"]);
});
