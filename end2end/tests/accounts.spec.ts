// Accounts (issue 6): the first start's setup page, signing in and out, roles enforced on the server, and
// API tokens shown once and revocable.
import { ADMIN, deploy, expect, signIn, tessera, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test.describe("the first start", () => {
  test.use({ withAdmin: false });

  test("with no account, the setup page makes the first admin and signs them in", async ({ page }) => {
    await page.goto("/nodes");
    await expect(page).toHaveURL(/\/setup$/);
    await expect(page.getByRole("heading", { name: "Set up Tessera" })).toBeVisible();
    await page.getByLabel("Admin name").fill("root-admin");
    await page.getByLabel("Password (at least 12 characters)").fill("a long password");
    await page.getByLabel("The password again").fill("another password");
    await page.getByRole("button", { name: "Make the admin" }).click();
    await expect(page.getByTestId("setup-error")).toHaveText("The two passwords differ; type the same one twice.");
    await page.getByLabel("Admin name").fill("root-admin");
    await page.getByLabel("Password (at least 12 characters)").fill("a long password");
    await page.getByLabel("The password again").fill("a long password");
    await page.getByRole("button", { name: "Make the admin" }).click();
    await expect(page).toHaveURL(/\/$/);
    await expect(page.getByTestId("signed-in")).toHaveText("root-admin · admin");
    await page.screenshot({ path: test.info().outputPath("after-setup.png"), fullPage: true });
    // Setup is over: it makes no second admin.
    await page.goto("/setup");
    await page.getByLabel("Admin name").fill("intruder");
    await page.getByLabel("Password (at least 12 characters)").fill("a long password");
    await page.getByLabel("The password again").fill("a long password");
    await page.getByRole("button", { name: "Make the admin" }).click();
    await expect(page).toHaveURL(/\/login$/);
  });
});

test.describe("signing in", () => {
  test.use({ withAdmin: false });

  test("a wrong password and an unknown name read the same on a page without the console's sections, and the right one lets in", async ({ page, data }) => {
    tessera(data, ["user", "add", ADMIN.name, "--role", "admin"], `${ADMIN.password}\n`);
    await page.goto("/machines/majin");
    await expect(page).toHaveURL(/\/login\?next=\/machines\/majin$/);
    // Nothing of the console is offered before signing in: no section leads anywhere yet.
    await expect(page.getByRole("navigation", { name: "Console" })).toHaveCount(0);
    for (const [name, password] of [[ADMIN.name, "not the password"], ["nobody", "not the password"]]) {
      await page.getByLabel("Name").fill(name);
      await page.getByLabel("Password").fill(password);
      await page.getByRole("button", { name: "Sign in" }).click();
      await expect(page.getByTestId("sign-in-error")).toHaveText("The name or the password is wrong.");
    }
    await page.screenshot({ path: test.info().outputPath("sign-in-refused.png"), fullPage: true });
    await page.getByLabel("Name").fill(ADMIN.name);
    await page.getByLabel("Password").fill(ADMIN.password);
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect(page).toHaveURL(/\/machines\/majin$/);
    await expect(page.getByRole("navigation", { name: "Console" })).toBeVisible();
    await page.getByRole("button", { name: "Sign out" }).click();
    await expect(page).toHaveURL(/\/login$/);
    await page.goto("/");
    await expect(page).toHaveURL(/\/login/);
  });
});

test("an admin adds an operator and a viewer; the viewer reads, and its change is refused", async ({ page, browser, server }) => {
  await open(page, "/admin");
  await expect(page.getByRole("heading", { name: "Accounts and API tokens" })).toBeVisible();
  for (const [name, role] of [["otto", "operator"], ["vera", "viewer"]]) {
    await page.getByLabel("Name", { exact: true }).fill(name);
    await page.getByLabel("Role").selectOption(role);
    await page.getByLabel("Password (at least 12 characters)").fill("a long password");
    await page.getByRole("button", { name: "Add the account" }).click();
    await expect(page.locator(`tr[data-account="${name}"]`)).toContainText(role);
  }
  // Others can be removed from here; one's own account cannot.
  await expect(page.getByRole("button", { name: "Remove otto" })).toBeVisible();
  await expect(page.getByRole("button", { name: "Remove admin" })).toHaveCount(0);
  await page.screenshot({ path: test.info().outputPath("accounts.png"), fullPage: true });

  const context = await browser.newContext({ baseURL: server });
  const viewer = await context.newPage();
  await signIn(viewer, "vera", "a long password");
  await expect(viewer.getByTestId("signed-in")).toHaveText("vera · viewer");
  await expect(viewer.getByRole("link", { name: "Accounts" })).toHaveCount(0);
  await viewer.goto("/deploy");
  await expect(viewer.locator('main[data-hydrated="true"]')).toHaveCount(1);
  await viewer.getByLabel("Model", { exact: true }).selectOption("speech");
  await viewer.locator("#node-h200-node").check();
  await viewer.getByRole("button", { name: "Next" }).click();
  await viewer.getByRole("button", { name: "Next" }).click();
  await viewer.getByRole("button", { name: "Deploy", exact: true }).click();
  await expect(viewer.getByTestId("deploy-error")).toHaveText("vera is a viewer: this needs the operator role.");
  await viewer.goto("/admin");
  await expect(viewer.getByRole("alert")).toContainText("this needs the admin role");
  await context.close();
});

test("a token is shown once, works for scripts, and stops working once its revocation is confirmed", async ({ page, playwright, server }) => {
  await open(page, "/admin");
  await page.getByLabel("What it is for").fill("ci");
  await page.getByRole("button", { name: "Make the token" }).click();
  const shown = page.getByTestId("token-secret");
  await expect(shown).toContainText("copy it now, it is not shown again");
  const secret = (await shown.locator("code").innerText()).trim();
  expect(secret).toMatch(/^tsr_[0-9a-f]{64}$/);
  const script = await playwright.request.newContext({ baseURL: server, extraHTTPHeaders: { Authorization: `Bearer ${secret}` } });
  expect((await script.get("/api/me")).status()).toBe(200);
  // Reloaded, the page serves the row at once but takes a click only once it has hydrated.
  await page.reload();
  await expect(page.locator('main[data-hydrated="true"]')).toHaveCount(1);
  await expect(page.locator('tr[data-token="ci"]')).toContainText("tsr_");
  await expect(page.locator("body")).not.toContainText(secret);
  await page.getByRole("button", { name: "Revoke ci" }).click();
  // Asked first, in red, Cancel focused: a revoked token cannot be brought back.
  const dialog = page.getByRole("alertdialog");
  await expect(dialog).toContainText("Revoke ci?");
  await expect(dialog.getByRole("button", { name: "Cancel" })).toBeFocused();
  await dialog.getByRole("button", { name: "Revoke" }).click();
  await expect(page.locator('tr[data-token="ci"]')).toContainText("revoked");
  expect((await script.get("/api/me")).status()).toBe(401);
  await script.dispose();
});

test("a script without a token, or a forged browser change, changes nothing", async ({ playwright, server, request }) => {
  const anonymous = await playwright.request.newContext({ baseURL: server });
  const refused = await anonymous.post("/api/deployments", { data: { model: "vision", gpus: ["atlas:0"], share: 25 } });
  expect(refused.status()).toBe(401);
  await anonymous.dispose();
  await deploy(request, { model: "vision", gpus: ["atlas:0"], share: 25 });
  const groups = await (await request.get("/api/groups")).json();
  expect(groups.map((g: any) => g.name)).toEqual(["vision"]);
});

test("a link to the console from another site keeps its reader signed in", async ({ page, server }) => {
  // A page of another site (served by the test itself: nothing leaves the machine) that links to the console.
  await page.route("http://chat.other.example/**", (route) =>
    route.fulfill({
      contentType: "text/html",
      body: `<!doctype html><title>A chat</title><a href="${server}/nodes">the nodes</a>`,
    }),
  );
  await page.goto("http://chat.other.example/room");
  await page.getByRole("link", { name: "the nodes" }).click();
  await expect(page).toHaveURL(`${server}/nodes`);
  await expect(page.getByTestId("signed-in")).toHaveText(`${ADMIN.name} · admin`);
  // The session is the signed-in one still, not an anonymous one made for the link.
  await page.goto("/models");
  await expect(page).toHaveURL(/\/models$/);
  await expect(page.getByTestId("signed-in")).toHaveText(`${ADMIN.name} · admin`);
});
