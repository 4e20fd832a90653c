// Every page: 0 serious or critical axe-core violations, reachable by keyboard, and a screenshot.
import AxeBuilder from "@axe-core/playwright";
import { deploy, expect, tessera, test } from "./fixtures/tessera";
import { open, Wizard } from "./fixtures/console";
import type { Page } from "@playwright/test";

async function audit(page: Page, name: string): Promise<void> {
  const results = await new AxeBuilder({ page }).analyze();
  const bad = results.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  await page.screenshot({ path: test.info().outputPath(`${name}.png`), fullPage: true });
  expect(
    bad.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(" ")).join(", ")})`),
    `${name}: serious or critical violations`,
  ).toEqual([]);
}

test("every page passes axe-core, its links are one blue, and the Cluster tabs stay put from tab to tab", async ({ page, request }) => {
  // Fifteen pages, each loaded, hydrated, audited and photographed: a bound on a hang, not on speed.
  test.setTimeout(180_000);
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "semantic-router", gpus: ["atlas:0"], share: 10, revision: 1 });
  await request.post("/api/workers", {
    data: { name: "listen", requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: 2.2 } } },
  });
  const linkColours = new Set<string>();
  const tabsAt = new Set<number>();
  for (const [path, name] of [
    ["/", "overview"],
    ["/models", "models"],
    ["/nodes", "nodes"],
    ["/repack", "repack"],
    ["/machines/majin", "machine"],
    ["/models/glm-5.3", "model"],
    ["/models/glm-5.3/sharing", "gpu-sharing"],
    ["/models/glm-5.3/serving", "serving-configuration"],
    ["/playground", "playground"],
    ["/usage", "usage"],
    ["/audit", "audit"],
    ["/admin", "accounts"],
  ]) {
    await open(page, path);
    await audit(page, name);
    // Links in the content, not tabs or buttons styled as links: one colour, visited or not.
    for (const colour of await page.locator("main a:not(.button):not(.tabs a)").evaluateAll((links) =>
      links.map((a) => getComputedStyle(a).color),
    )) {
      linkColours.add(colour);
    }
    if (["/models", "/nodes", "/repack"].includes(path)) {
      await expect(page.getByRole("heading", { name: "Cluster", level: 1 })).toBeVisible();
      tabsAt.add((await page.locator("nav.tabs").boundingBox())!.y);
    }
  }
  expect([...linkColours]).toHaveLength(1);
  expect([...tabsAt]).toHaveLength(1);
  const wizard = new Wizard(page);
  await wizard.open();
  await audit(page, "deploy-step-1");
  await wizard.place("vision", ["atlas"]);
  await audit(page, "deploy-step-3");
  await wizard.panel.type("vision", "80");
  await audit(page, "deploy-refused");
});

test.describe("at 768 px", () => {
  test.use({ viewport: { width: 768, height: 1024 } });

  test("every page fits the width: only a wide table scrolls, inside its own box", async ({ page, request }) => {
    test.setTimeout(120_000);
    await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
    for (const path of ["/", "/models", "/nodes", "/repack", "/machines/atlas", "/models/glm-5.3", "/models/glm-5.3/sharing", "/deploy", "/playground", "/usage", "/audit", "/admin"]) {
      await open(page, path);
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
      expect(overflow, `${path} is wider than the window`).toBeLessThanOrEqual(0);
    }
    await open(page, "/models");
    await page.screenshot({ path: test.info().outputPath("models-768.png"), fullPage: true });
  });
});

test.describe("signed out", () => {
  test.use({ withAdmin: false });
  test("the setup and sign-in pages pass axe-core", async ({ page, data }) => {
    await page.goto("/");
    await expect(page).toHaveURL(/\/setup$/);
    await audit(page, "setup");
    tessera(data, ["user", "add", "admin", "--role", "admin"], "a long e2e password\n");
    await page.goto("/login?error=wrong");
    await audit(page, "sign-in");
  });
});

test("the wizard can be driven by keyboard alone", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  const wizard = new Wizard(page);
  await wizard.open();
  await page.getByLabel("Model", { exact: true }).focus();
  await page.keyboard.press("ArrowDown");
  await expect(page.getByLabel("Model", { exact: true })).not.toHaveValue("");
  await page.locator("#node-atlas").focus();
  await page.keyboard.press("Space");
  await expect(page.locator("#node-atlas")).toBeChecked();
  await wizard.next.focus();
  await page.keyboard.press("Enter");
  await expect(wizard.step).toHaveText("Serving");
  // Each step change moves the focus to its heading: Enter again does nothing there.
  await expect(wizard.step).toBeFocused();
});

test("three Enter presses from the first step deploy nothing: each step change focuses its heading", async ({ page, request }) => {
  const before = await (await request.get("/api/groups")).json();
  const wizard = new Wizard(page);
  await wizard.open();
  await page.getByLabel("Model", { exact: true }).selectOption("speech");
  await page.locator("#node-atlas").check();
  await wizard.next.focus();
  for (let i = 0; i < 3; i++) await page.keyboard.press("Enter");
  await expect(wizard.step).toHaveText("Serving");
  await expect(wizard.step).toBeFocused();
  expect(await (await request.get("/api/groups")).json()).toEqual(before);
  await expect(page).toHaveURL(/\/deploy$/);
});
