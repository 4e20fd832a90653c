// What changes on the server shows without a reload: the runtime's event stream moves the page.
import { deploy, expect, test } from "./fixtures/tessera";
import { open, ModelsTab } from "./fixtures/console";

// The demo engines take 4 s to "load", so the page sees them start.
test.use({ engineStartMs: 4000 });

test("a model becomes healthy on the Models tab without a reload", async ({ page, request }) => {
  await open(page, "/");
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
