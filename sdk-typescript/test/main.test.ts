// One test process for every suite, so they share one cluster (a node:test
// file is its own process). Each suite registers its tests on import.
import { after } from "node:test";
import { stopCluster } from "./cluster.js";
import "./curated.js";
import "./cancellation.js";
import "./auth.js";
import "./errors.js";
import "./lifetime.js";
import "./config.js";
import "./ssh.js";
import "./host.js";
import "./testing.js";
import "./files.js";
import "./logs.js";

after(stopCluster);
