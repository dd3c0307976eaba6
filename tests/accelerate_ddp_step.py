"""One data-parallel training step under `accelerate launch`, for tests/test_trainer.py.

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \
        --dynamo_backend no --main_process_port PORT tests/accelerate_ddp_step.py OUT BATCH MODEL_DIR [MODEL_DIR ...]

(`--multi_gpu` picks accelerate's torchrun launcher, which starts the processes; with ACCELERATE_USE_CPU each runs
on the CPU and they talk over gloo. `accelerate launch --cpu --num_processes 2` starts ONE process unless mpirun is
configured.)

For each model folder: load it, shard the global batch BATCH (a safetensors file with `input_ids`)
across the processes with a DataLoader prepared by the Accelerator, take one SGD step, and write from the main
process OUT/<index>.safetensors with the gradients (averaged over processes by DDP), the updated parameters and the
gathered input batch; OUT/run.json says how the step ran.
"""

import json
import sys
import weakref
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator, InitProcessGroupKwargs
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import shapeformers  # noqa: F401  (registers both model types with the Auto classes)

# Plain SGD: the updated weights are then a linear function of the gradients, comparable to a tolerance (Adam's
# first step, lr * g / (|g| + eps), flips with the sign of gradients that are zero up to rounding).
LEARNING_RATE = 0.1


def main():
    output, batch_path, *folders = sys.argv[1:]
    # A collective that cannot connect fails after two minutes with gloo's own error, instead of hanging the test.
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(minutes=2))])
    batch = load_file(batch_path)["input_ids"]  # [global batch, seq]
    per_process = len(batch) // accelerator.num_processes
    for index, folder in enumerate(folders):
        # On stderr, so that a test that times out can show how far each process got.
        print(f"process {accelerator.process_index}: {folder}", file=sys.stderr, flush=True)
        model = AutoModelForCausalLM.from_pretrained(folder)  # registered by `import shapeformers`
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(batch), batch_size=per_process)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        model.train()
        (input_ids,) = next(iter(loader))
        loss = model(input_ids=input_ids, labels=input_ids).loss
        accelerator.backward(loss)
        named = list(accelerator.unwrap_model(model).named_parameters())
        gradients = {f"grad.{name}": parameter.grad.detach().clone() for name, parameter in named}
        optimizer.step()
        seen = accelerator.gather(input_ids)
        if accelerator.is_main_process:
            tensors = {**gradients, **{f"param.{name}": p.detach().clone() for name, p in named}, "seen": seen}
            tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}
            save_file(tensors, Path(output) / f"{index}.safetensors")
        accelerator.wait_for_everyone()
        # Free the DDP wrapper while the process group is still registered. If the wrapper's reducer held the group's
        # last reference, its destructor would run gloo's, which joins gloo's worker thread holding the GIL while
        # that thread may wait for the GIL to free a finished collective's tensors: the process then never exits
        # (pytorch/pytorch#56297; one run in ten here, at the end_training below, before this).
        wrapper = weakref.ref(model)
        del model, optimizer, loader
        accelerator.free_memory()
        assert wrapper() is None, "something still holds the DDP wrapper"
    if accelerator.is_main_process:
        run = {"num_processes": accelerator.num_processes, "distributed_type": str(accelerator.distributed_type),
               "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None}  # fmt: skip
        (Path(output) / "run.json").write_text(json.dumps(run))
    accelerator.end_training()


if __name__ == "__main__":
    main()
