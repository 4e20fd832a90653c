import { defineConfig } from "@playwright/test";

// Debian's Chromium, started as this machine allows: no sandbox (root), no GPU, and no background traffic
// to hosts the network does not reach.
const chromiumArgs = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

export default defineConfig({
  testDir: "./tests",
  timeout: 60_000,
  expect: { timeout: 10_000 },
  // One test at a time: two at once on a two-core CI machine saved 0.7 of 4.7 minutes and made the
  // pages' hydration slow enough to fail two specs there.
  fullyParallel: false,
  workers: 1,
  retries: 0,
  forbidOnly: !!process.env.CI,
  reporter: [["list"]],
  outputDir: "test-results",
  use: {
    browserName: "chromium",
    launchOptions: { executablePath: process.env.CHROMIUM_PATH ?? "/usr/bin/chromium", args: chromiumArgs },
    screenshot: "on",
    trace: "retain-on-failure",
  },
});
