// Seed 003, "Resolve a Refused Sharing Plan": each row of its table, and the warning over 90 % that does
// not block. Every verdict comes from `placement` in the browser; typing sends nothing to the server.
import { deploy, expect, test } from "./fixtures/tessera";
import { FITS, NO_EXPLICIT_SHARE, NO_SHARE, OVER, WARNING, Wizard } from "./fixtures/console";

test.beforeEach(async ({ request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "semantic-router", gpus: ["atlas:0"], share: 10, revision: 1 });
});

test("each refusal of the seed's table makes Deploy unavailable, with the seed's words; over 100 % the bar shows by how much in red and no column moves", async ({ page }) => {
  const wizard = new Wizard(page);
  await wizard.open();
  await wizard.place("vision", ["atlas"]);
  const sent: string[] = [];
  page.on("request", (r) => sent.push(`${r.method()} ${r.url()}`));
  const { panel } = wizard;

  const columns = async () =>
    Promise.all(["Model", "GPU memory share", "Memory", "Loading"].map(async (name) => (await page.getByRole("columnheader", { name, exact: true }).boundingBox())!.x));
  const before = await columns();
  await panel.type("vision", "70");
  await expect(panel.verdict).toHaveText(OVER);
  await expect(panel.total).toHaveText("120%");
  await expect(wizard.deploy).toBeDisabled();
  // Past 100 % the bar runs past the GPU's end in red, and the panel says by how much, in the Free row too.
  await expect(page.getByTestId("over-by")).toHaveText("Over by 20% of the GPU (19.2 GB): the red part of the bar does not fit.");
  await expect(panel.free).toHaveText("none: over by 20%");
  await expect(page.locator("svg.bar rect.overflow")).toHaveCount(1);
  // The columns stayed where they were while the figures changed.
  expect(await columns()).toEqual(before);
  await page.screenshot({ path: test.info().outputPath("share-over-100.png"), fullPage: true });

  await panel.type("vision", "0");
  await expect(panel.verdict).toHaveText(`vision: ${NO_SHARE}`);
  await expect(wizard.deploy).toBeDisabled();

  await panel.type("vision", "");
  await expect(panel.verdict).toHaveText(`vision: ${NO_EXPLICIT_SHARE}`);
  await expect(wizard.deploy).toBeDisabled();
  await page.screenshot({ path: test.info().outputPath("refused-plan.png"), fullPage: true });

  await panel.type("vision", "25");
  await expect(panel.verdict).toHaveText(FITS("75%"));
  await expect(page.getByTestId("over-by")).toHaveCount(0);
  await expect(page.locator("svg.bar rect.overflow")).toHaveCount(0);
  await expect(wizard.deploy).toBeEnabled();
  expect(sent, "every verdict was worked out in the browser").toEqual([]);
});

test("over 90 % the Free row warns, and Deploy stays available", async ({ page, request }) => {
  const wizard = new Wizard(page);
  await wizard.open();
  await wizard.place("vision", ["atlas"]);
  const { panel } = wizard;
  await panel.type("vision", "45");
  await expect(panel.verdict).toHaveText(FITS("95%"));
  await expect(panel.free).toHaveText("5%");
  await expect(panel.freeWarning).toHaveText(WARNING);
  await expect(wizard.deploy).toBeEnabled();
  await page.screenshot({ path: test.info().outputPath("warning-over-90.png"), fullPage: true });
  await wizard.deploy.click();
  await expect(page).toHaveURL(/deployed=vision/);
  const group = await (await request.get("/api/groups/text-router")).json();
  expect(group.total_percent).toBe(95);
});
