#!/usr/bin/env bash
# What `make test` needs beyond the python:3.11-bookworm image, so the Cloud Build `test` step runs
# the whole suite as CI does instead of skipping: Java and the Cloud CLI's Pub/Sub emulator (the
# sandbox tests), and Terraform (fmt and templatefile checks; the same release the deploy step
# runs). Everything is pinned; Terraform's zip is checked against HashiCorp's SHA256SUMS.
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
rm -rf "$tmp"

java -version 2>&1 | head -1
gcloud --version | head -1
terraform version | head -1
