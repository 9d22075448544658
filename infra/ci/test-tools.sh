#!/usr/bin/env bash
# What `make test` needs beyond the python:3.11-bookworm image, so the Cloud Build `test` step runs
# the whole suite as CI does instead of skipping: Java and the Cloud CLI's Pub/Sub emulator (the
# sandbox tests), Terraform (fmt and templatefile checks; the same release the deploy step runs)
# and, when the sandbox builds real Kubernetes components, the Go its module names. Everything is
# pinned, and the downloaded archives are checked against their publishers' sha256.
set -euo pipefail

GCLOUD_VERSION="528.0.0-0"
TERRAFORM_VERSION="1.9.8"

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends ca-certificates curl gnupg unzip openjdk-17-jre-headless

# Google's apt repository (the Cloud CLI's documented Debian install).
curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg
echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main" \
  > /etc/apt/sources.list.d/google-cloud-sdk.list
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  "google-cloud-cli=${GCLOUD_VERSION}" "google-cloud-cli-pubsub-emulator=${GCLOUD_VERSION}"

tmp="$(mktemp -d)"
base="https://releases.hashicorp.com/terraform/${TERRAFORM_VERSION}"
zip="terraform_${TERRAFORM_VERSION}_linux_amd64.zip"
curl -fsSL --retry 3 -o "$tmp/$zip" "$base/$zip"
curl -fsSL --retry 3 -o "$tmp/SHA256SUMS" "$base/terraform_${TERRAFORM_VERSION}_SHA256SUMS"
(cd "$tmp" && grep " ${zip}\$" SHA256SUMS | sha256sum -c -)
unzip -q -o "$tmp/$zip" terraform -d /usr/local/bin

# Go, when the sandbox builds real Kubernetes components from their pinned module (make kube-bins):
# the release its go.mod names (toolchain line, else go line), checked against go.dev's published sha256.
go_mod="$(cd "$(dirname "$0")/../.." && pwd)/sandbox/kube/go/go.mod"
if [ -f "$go_mod" ]; then
  go_version="$(sed -n 's/^toolchain go//p' "$go_mod")"
  [ -n "$go_version" ] || go_version="$(sed -n 's/^go //p' "$go_mod")"
  archive="go${go_version}.linux-amd64.tar.gz"
  curl -fsSL --retry 3 -o "$tmp/$archive" "https://go.dev/dl/$archive"
  want="$(curl -fsSL --retry 3 'https://go.dev/dl/?mode=json&include=all' | python3 -c '
import json, sys
name = sys.argv[1]
print(next(f["sha256"] for r in json.load(sys.stdin) for f in r["files"] if f["filename"] == name))
' "$archive")"
  echo "$want  $tmp/$archive" | sha256sum -c -
  tar -C /usr/local -xzf "$tmp/$archive"
  export PATH="/usr/local/go/bin:$PATH"
  ln -sf /usr/local/go/bin/go /usr/local/bin/go
  go version
fi
rm -rf "$tmp"

java -version 2>&1 | head -1
gcloud --version | head -1
terraform version | head -1
