/// <reference types="vitest/config" />
import { defineConfig } from "vite";

// A plain static build: everything the page needs is bundled into dist/ (no CDN at run time).
export default defineConfig({
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    sourcemap: false,
    reportCompressedSize: true,
  },
  // Unit tests (Vitest) live next to the code; the browser test in e2e/ is `npm run e2e`.
  test: {
    include: ["src/**/*.test.ts"],
    environment: "node",
  },
});
