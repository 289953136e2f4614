"""A video pipeline as one multi-stage job: audit, then transcode, then publish.

Each stage is an attempt of the same job. ``ferryq.Next`` ends a stage and queues the
job again at the next one, with what that stage needs in its context; every stage
gets its own tries. Run it from the repository's root:

    python -m examples.video_pipeline                        # a throwaway SQLite file
    FERRYQ_URL=postgresql://localhost/app python -m examples.video_pipeline
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import ferryq

app = ferryq.App(os.environ.get("FERRYQ_URL") or f"sqlite:///{tempfile.mkdtemp()}/video.db")


@app.task(max_tries=3, retry=ferryq.backoff.fixed(0))
def video(ctx: ferryq.Context, path: str) -> Any:
    if ctx.stage == "audit":
        if not path.endswith((".mov", ".mkv")):
            raise ferryq.Fail(f"{path} is not a video")  # dead at once: no more tries
        return ferryq.Next("transcode", context={"source": path, "seconds": 10 * len(path)})
    if ctx.stage == "transcode":
        if "shaky" in path and ctx.attempt == 1:
            raise RuntimeError("encoder crashed")  # retried: the audit does not run again
        output = path.rsplit(".", 1)[0] + ".mp4"
        return ferryq.Next("publish", context={**ctx.context, "output": output})
    return {
        "url": f"https://cdn.example/{ctx.context['output']}",
        "seconds": ctx.context["seconds"],
    }


def main() -> None:
    paths = ["holiday.mov", "shaky-interview.mkv", "notes.txt"]
    handles = [video.options(stage="audit").enqueue(path) for path in paths]
    app.run_worker(burst=True, concurrency=2)  # run everything due, then return
    for path, handle in zip(paths, handles, strict=True):
        job = app.get_job(handle.id)
        stages = ", ".join(f"{s['stage']} {s['outcome']} ({s['attempts']})" for s in job.stages)
        outcome = job.result if job.error is None else job.error["message"]
        print(f"{path}: {job.state}: {outcome}")
        print(f"    stages (tries): {stages}")
    app.close()


if __name__ == "__main__":
    main()
