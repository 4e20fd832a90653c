// Every page reads well before any wasm runs: the server renders it with its data.
import { deploy, expect, signIn, test } from "./fixtures/tessera";
import { FITS } from "./fixtures/console";

test("the pages are rendered on the server, data included", async ({ browser, request, server }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  const context = await browser.newContext({ javaScriptEnabled: false, baseURL: server });
  const page = await context.newPage();
  // The sign-in form is plain HTML: it works without any script too.
  await signIn(page);

  await page.goto("/models");
  await expect(page.locator('tr[data-model="glm-5.3"]').getByTestId("group")).toHaveText("text-router");
  await page.goto("/");
  await expect(page.getByTestId("models-line")).toContainText("1 model: ");
  await page.goto("/nodes");
  await expect(page.locator('tr[data-node="atlas"]').getByTestId("node-models")).toHaveText("glm-5.3 40%");
  await page.goto("/machines/atlas");
  await expect(page.getByTestId("gpu-sharers").first()).toHaveText("shared: glm-5.3 38.4 GB — 38.4 GB taken");
  await page.goto("/models/glm-5.3/sharing");
  await expect(page.getByTestId("verdict")).toHaveText(FITS("40%"));
  await page.goto("/deploy");
  await expect(page.getByTestId("step")).toHaveText("Model and placement");
  await page.goto("/machines/nowhere");
  await expect(page.getByRole("alert")).toContainText("there is no machine named nowhere");
  await context.close();
});

test("each page has a title of its own, from the server and after moving between pages", async ({ browser, page, server }) => {
  const titles: [string, string][] = [
    ["/", "Overview · Tessera"],
    ["/models", "Models · Tessera"],
    ["/nodes", "Nodes · Tessera"],
    ["/repack", "Repack · Tessera"],
    ["/deploy", "Deploy a model · Tessera"],
    ["/machines/atlas", "atlas · Tessera"],
    ["/usage", "Usage · Tessera"],
    ["/playground", "Playground · Tessera"],
    ["/audit", "Audit log · Tessera"],
    ["/admin", "Accounts and API tokens · Tessera"],
  ];
  // As the server sends it, before any script.
  const context = await browser.newContext({ javaScriptEnabled: false, baseURL: server });
  const plain = await context.newPage();
  await signIn(plain);
  for (const [path, title] of titles) {
    await plain.goto(path);
    await expect(plain).toHaveTitle(title);
  }
  await context.close();
  // Moving from page to page in the browser.
  await page.goto("/");
  await expect(page.locator('main[data-hydrated="true"]')).toHaveCount(1);
  await page.getByRole("navigation", { name: "Console" }).getByRole("link", { name: "Usage" }).click();
  await expect(page).toHaveTitle("Usage · Tessera");
});
