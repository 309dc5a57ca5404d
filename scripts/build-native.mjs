// Builds the native core (native/CMakeLists.txt) in Release into native/build. Runs on
// `npm install` and `npm run build`; CMake only recompiles what changed.
// Set SEARCHR1_SKIP_NATIVE=1 to skip it (the TypeScript commands that need no native
// executable still work).
import { spawnSync } from "node:child_process";
import { availableParallelism } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const source = join(root, "native");
const build = join(root, "native", "build");

if (process.env.SEARCHR1_SKIP_NATIVE === "1") {
  console.log("searchr1: SEARCHR1_SKIP_NATIVE=1, not building the native core");
  process.exit(0);
}

function run(args) {
  const r = spawnSync("cmake", args, { stdio: "inherit" });
  if (r.error?.code === "ENOENT") {
    console.error(
      "searchr1: cmake was not found. The native core needs cmake and a C++17 compiler " +
        "(Debian/Ubuntu: apt-get install cmake g++); OpenBLAS (libopenblas-dev) is " +
        "optional and makes the CPU backend faster.",
    );
    process.exit(1);
  }
  if (r.status !== 0) {
    console.error(`searchr1: building the native core failed (cmake ${args.join(" ")})`);
    process.exit(r.status ?? 1);
  }
}

run(["-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release"]);
run(["--build", build, "--parallel", String(availableParallelism())]);
