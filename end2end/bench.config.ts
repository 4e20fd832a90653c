// The console's browser benchmarks (scripts/bench-console): the same Chromium as the tests, one run.
import { defineConfig } from "@playwright/test";
import base from "./playwright.config";

export default defineConfig({
  ...base,
  testDir: "./bench",
  testMatch: "**/*.bench.ts",
  reporter: [["list"]],
  use: { ...base.use, screenshot: "off", trace: "off" },
});
