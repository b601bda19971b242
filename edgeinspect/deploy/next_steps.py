"""What `deploy render` prints last: the steps from the rendered folder to the first report, for this inventory
(its boxes, addresses, image tags and folders), in the order of compose/DEPLOY.md."""

from __future__ import annotations

from pathlib import Path

from edgeinspect.deploy import tokens
from edgeinspect.deploy.inventory import Inventory, Role


def next_steps(inv: Inventory, out: Path, compose: bool, k8s: bool, ca_dir: Path | None) -> list[str]:
    """Numbered lines; `ca_dir`: the plant CA's folder when the plant runs TLS (None: plaintext)."""
    plant = inv.plant
    data = plant.data_dir
    model_boxes = sorted({b.name for r in (Role.vision, Role.stage, Role.gateway) for b in inv.boxes_with(r)})
    kb_boxes = [b.name for b in inv.boxes_with(Role.retrieval)]
    images = [plant.image] + ([plant.hailo_image] if any(b.hailo for b in inv.boxes_with(Role.vision)) else [])
    steps = [
        f"On every box: sudo mkdir -p {data}/{{checkpoints,kb,reports,cache,frames,banks}}; copy the checkpoint to "
        f"{plant.checkpoint_path} on {', '.join(model_boxes)}"
        + (f" and the KB (`edgeinspect kb index`) to {plant.kb_dir} on {', '.join(kb_boxes)}" if kb_boxes else "")
        + f"; then sudo chown -R 10001:10001 {data}",
        f"Build the image ({', '.join(images)}): tools/wheelhouse.sh && DOCKER_BUILDKIT=1 docker build "
        f"-f compose/Dockerfile -t {plant.image} .  (DEPLOY.md section 2; docker save/load where no registry)",
    ]
    if compose:
        for box in inv.boxes:
            steps.append(
                f"Box {box.name}: rsync -a {out / box.name}/ {box.address}:/opt/edgeinspect/, then there: "
                "cd /opt/edgeinspect && sudo chown -R 10001:10001 config secrets && docker compose up -d"
            )
        steps.append(
            f"Or pilot everything on this machine: cd {out / 'all-in-one'} && sudo chown -R 10001:10001 config "
            "secrets && docker compose up -d   (Compose v1: docker-compose up -d)"
        )
    if k8s:
        steps.append(f"k3s: label the nodes (DEPLOY.md section 6), then kubectl apply -k {out / 'k8s'}")
    gateway = inv.boxes_with(Role.gateway)[0]
    ca = f" --ca {ca_dir / 'ca.crt'}" if ca_dir is not None else ""
    steps.append(
        f"The first report: edgeinspect deploy smoke --gateway {gateway.address}:{plant.ports.gateway} --image "
        f"part.jpg --token $(cat {out / tokens.ADMIN_FILE}){ca}"
    )
    return [f"{k}. {line}" for k, line in enumerate(steps, 1)]
