// The Audit page: every change with who made it, before → after, the revision and who restarted.
import { deploy, expect, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test("a share change shows on the Audit page with what changed field by field, its restarts, and the filter narrows it", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "vision", gpus: ["atlas:0"], share: 25, revision: 1 });
  const changed = await request.put("/api/groups/text-router/plan", {
    data: { revision: 2, shares: { "glm-5.3": 30, vision: 35 } },
  });
  expect(changed.status()).toBe(200);
  await open(page, "/audit");
  const first = page.getByTestId("audit-row").first();
  await expect(first.getByTestId("audit-action")).toHaveText("plan.change");
  await expect(first.getByTestId("audit-actor")).toHaveText("admin");
  await expect(first.getByTestId("audit-target")).toHaveText("text-router");
  await expect(first.getByTestId("audit-restarts")).toHaveText("glm-5.3, vision");
  // What changed, field by field; the entry as recorded a click away.
  await expect(first.getByTestId("audit-changes").locator("li")).toContainText(["shares.glm-5.3: 40.0 → 30.0", "shares.vision: 25.0 → 35.0"]);
  await expect(first).toContainText('"glm-5.3":40.0');
  await expect(first).toContainText('"glm-5.3":30.0');
  await page.getByLabel("What (such as deploy, plan, worker)").fill("deploy");
  await page.getByRole("button", { name: "Show" }).click();
  await expect(page).toHaveURL(/action=deploy/);
  await expect(page.getByTestId("audit-action")).toHaveText(["deploy", "deploy"]);
  await page.screenshot({ path: test.info().outputPath("audit.png"), fullPage: true });
});
