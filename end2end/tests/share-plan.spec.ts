import { expect, test } from "@playwright/test";
import { SharePlanPage } from "./fixtures/share-plan-page";

const FITS = (total: string) => `The shares add up to ${total} of one accelerator, which fits.`;
const OVER = "The shares add up to more than the accelerator holds.";
const NO_SHARE = "A model reserves no share of the accelerator.";
const NO_EXPLICIT_SHARE = "A model has no explicit share, so the planned total cannot include it.";
const WARNING = "More than 90% of the accelerator is shared out";

test("the page is rendered on the server before any wasm runs", async ({ browser }) => {
  const context = await browser.newContext({ javaScriptEnabled: false });
  const page = await context.newPage();
  await page.goto("/");
  await expect(page.getByRole("heading", { name: "Shared GPU memory" })).toBeVisible();
  await expect(page.getByTestId("verdict")).toHaveText(FITS("85%"));
  await context.close();
});

test("the verdict follows every keystroke, in the browser alone", async ({ page }) => {
  const panel = new SharePlanPage(page);
  await panel.open();
  const sent: string[] = [];
  page.on("request", (request) => sent.push(`${request.method()} ${request.url()}`));

  await expect(panel.verdict).toHaveText(FITS("85%"));

  // One key at a time: "4" leaves glm-5.3 at 4 %, "46" takes the plan past 90 %.
  await panel.share("glm-5.3").fill("");
  await expect(panel.verdict).toHaveText(`glm-5.3: ${NO_EXPLICIT_SHARE}`);
  await panel.share("glm-5.3").press("4");
  await expect(panel.verdict).toHaveText(FITS("49%"));
  await panel.share("glm-5.3").press("6");
  await expect(panel.verdict).toHaveText(FITS("91%"));
  await expect(panel.free).toHaveText("9%");
  await expect(panel.freeWarning).toContainText(WARNING);

  await panel.type("glm-5.3", "70");
  await expect(panel.verdict).toHaveText(OVER);
  await expect(panel.total).toHaveText("115%");

  await panel.type("glm-5.3", "40");
  await panel.type("vision", "0");
  await expect(panel.verdict).toHaveText(`vision: ${NO_SHARE}`);

  await panel.type("vision", "33.33");
  await expect(panel.verdict).toHaveText(FITS("93.33%"));
  await expect(panel.freeWarning).toContainText(WARNING);

  await panel.type("speech", "");
  await expect(panel.verdict).toHaveText(`speech: ${NO_EXPLICIT_SHARE}`);

  expect(sent, "typing sent no request to the server").toEqual([]);
});

test("the router's share is not editable", async ({ page }) => {
  const panel = new SharePlanPage(page);
  await panel.open();
  const router = panel.share("semantic-router");
  await expect(router).toHaveAttribute("readonly", "");
  await expect(page.getByTestId("not-editable")).toHaveText("not editable");
  await router.pressSequentially("99");
  await expect(router).toHaveValue("10");
  await expect(panel.verdict).toHaveText(FITS("85%"));
});

test("the server's verdict matches the browser's", async ({ page }) => {
  const panel = new SharePlanPage(page);
  await panel.open();
  const plans: Array<[string, string, string]> = [
    ["glm-5.3", "40", FITS("85%")],
    ["glm-5.3", "46", FITS("91%")],
    ["glm-5.3", "70", OVER],
    ["speech", "0", `speech: ${NO_SHARE}\n${OVER}`],
  ];
  for (const [member, share, expected] of plans) {
    await panel.type(member, share);
    const browserSays = (await panel.verdict.locator("li").allInnerTexts()).join("\n");
    expect(browserSays).toBe(expected);
    const answer = page.waitForResponse((r) => r.url().endsWith("/rpc/check_share_plan"));
    await panel.askServer.click();
    expect((await answer).status()).toBe(200);
    await expect(panel.agreement).toHaveText("The server's verdict matches the browser's.");
    expect((await panel.serverVerdict.locator("li").allInnerTexts()).join("\n")).toBe(expected);
  }
  await page.screenshot({ path: test.info().outputPath("share-plan.png"), fullPage: true });
});
