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
  // Each test has a server and a data folder of its own (fixtures/tessera.ts): two spec files at once
  // share nothing, and on two cores they overlap one's waits (engines loading, pages hydrating) with the
  // other's work. A test within a file runs after the one before it.
  fullyParallel: false,
  workers: 2,
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
