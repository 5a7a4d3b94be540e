"""Tests of the conformance judge; `conformance/harness --self-test` runs them."""
