"""Run by the tests of this folder, under `accelerate launch` (2 CPU processes: DDP, DeepSpeed ZeRO-2/3, FSDP2) or
alone: a few GRPO steps on a global batch of 16 completions, then each rank records what it really ran under, the
completions the trainer's own generator produced and its final weights.

Training completions are made deterministic (a completion is a function of its prompt and of its place in the
prompt's group), so one process and two, under every engine, train on the same completions, and their final
weights can be compared. The trainer's real generator still runs at every round (greedy, so engines can be
compared): under ZeRO-3 it generates on the gathered weights or through DeepSpeed's hooks.

usage: _worker.py WORK PER_DEVICE [--beta B] [--no-gather] [--lora]
"""

import argparse
import json
import os

import torch
from datasets import Dataset

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.demo import copy_digit_reward, prepare_demo
from grpokit.generation import Generated
from grpokit.models import ignore_boolean_buffers
from grpokit.sharding import fsdp2_sharded, full_parameters, is_sharded, zero3_partitioned


class ScriptedCompletions:
    """Completion k of a prompt's group: four ids that depend on the prompt and on k, so rewards vary in a group.
    The real generator runs first on the same prompts; what it produced is kept in `real`."""

    def __init__(self, tokenizer, real, rank: int):
        self.digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
        self.real_generator = real
        # Ranks generate different lengths, so they make different numbers of forward calls: generation through
        # ZeRO-3's hooks must keep them in step.
        real.generation_config.max_new_tokens = 2 + 2 * rank
        self.real = []
        self.saw_sharded = []  # per round: did generation see sharded (not gathered) weights?
        original = real._generate

        def _generate(model, inputs):
            self.saw_sharded.append(is_sharded(model))
            return original(model, inputs)

        real._generate = _generate

    def generate(self, prompt_ids):
        self.real.append(self.real_generator.generate(prompt_ids).completion_ids)
        seen = {}
        out = []
        for prompt in prompt_ids:
            k = seen[tuple(prompt)] = seen.get(tuple(prompt), -1) + 1
            out.append([self.digits[(sum(prompt) * (j + 1) + k * (j + 2)) % 10] for j in range(4)])
        return Generated(out)

    def sync_weights(self, model):
        self.real_generator.sync_weights(model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work")
    parser.add_argument("per_device", type=int)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--no-gather", action="store_true", help="ds3_gather_for_generation=False")
    parser.add_argument("--flag-buffer", action="store_true", help="a boolean buffer, ignored by DDP")
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (the reference: adapter disabled)")
    options = parser.parse_args()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
        # DeepSpeed JIT-compiles its optional shared-memory all-reduce op (minutes) on a CPU machine's first launch;
        # gloo does without it.
        import importlib

        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    if os.environ.get("ACCELERATE_USE_FSDP") == "true":
        import _fsdp_cpu_shim

        _fsdp_cpu_shim.install()

    from accelerate import PartialState

    # DeepSpeed runs on CPU processes only when accelerate is not told "cpu" (that gives plain MULTI_CPU) and its
    # backend is gloo (without it, every process counts one process).
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"
    state = PartialState(cpu=not deepspeed, **({"backend": "gloo"} if deepspeed else {}))
    with state.local_main_process_first():
        model_dir, _ = prepare_demo(options.work, rows=64)
    args = GRPOConfig(
        output_dir=os.path.join(options.work, "out"),
        per_device_train_batch_size=options.per_device,
        num_generations=8,
        max_completion_length=4,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-3,
        beta=options.beta,
        # without LoRA the reference model moves halfway to the policy after every step (TR-DPO), on every engine
        sync_ref_model=not options.lora,
        ref_model_sync_steps=1,
        ref_model_mixup_alpha=0.5,
        ds3_gather_for_generation=not options.no_gather,
        generation_kwargs={"do_sample": False},
        use_cpu=not deepspeed,
        ddp_backend="gloo" if deepspeed else None,
        bf16=False,
        report_to="none",
        save_strategy="no",
    )
    data = Dataset.from_list([{"prompt": f"{i % 10}="} for i in range(64)])
    peft_config = None
    if options.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model_dir, copy_digit_reward, args=args, train_dataset=data, peft_config=peft_config)
    rank = trainer.accelerator.process_index
    trainer.generator = ScriptedCompletions(trainer.processing_class, trainer.generator, rank)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    ignored = []
    if options.flag_buffer:
        policy.model.layers[0].register_buffer("flag", torch.ones(1, dtype=torch.bool))  # what DDP cannot broadcast
        ignored = ignore_boolean_buffers(policy)
    trainer.train()
    wrapped = trainer.model_wrapped
    record = {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "num_processes": trainer.accelerator.num_processes,
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "wrapper": type(wrapped).__name__,
        "ignored": ignored,
        "ddp_ignores": sorted(getattr(wrapped, "parameters_to_ignore", None) or []),
        "steps": trainer.state.global_step,
        "real_completions": trainer.generator.real,
        "generation_saw_sharded": trainer.generator.saw_sharded,
        "reference": None if trainer.ref_model is None else type(trainer.ref_model).__name__,
        "reference_sharded": trainer.ref_model is not None and reference_sharded(trainer),
        **full_weights(trainer),
    }
    # Saving gathers the whole model (ZeRO-3: 16-bit gather on save; FSDP2: full state dict); rank 0 writes it.
    saved = os.path.join(options.work, "saved")
    trainer.save_model(saved)
    trainer.accelerator.wait_for_everyone()
    if rank == 0:  # read back as files (from_pretrained would take part in ZeRO-3's collectives)
        from safetensors.torch import load_file

        files = [f for f in os.listdir(saved) if f.endswith(".safetensors")]
        tensors = {k: v for f in files for k, v in load_file(os.path.join(saved, f)).items()}
        # adapter files name LoRA weights without the adapter's name
        record["saved_weights"] = {
            name: tensors[key].float().flatten().tolist()
            for name in record["names"]
            if (key := name.replace(".default.", ".")) in tensors
        }
    with open(os.path.join(options.work, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def reference_sharded(trainer) -> bool:
    reference = trainer.accelerator.unwrap_model(trainer.ref_model)
    return zero3_partitioned(reference) or fsdp2_sharded(reference)


def full_weights(trainer) -> dict:
    """The policy's and the reference model's full weights on every rank (gathered under ZeRO-3 / FSDP2), and how
    many of the policy's elements this rank held."""
    policy = trainer.accelerator.unwrap_model(trainer.model)
    local = sum(local_numel(p) for p in policy.parameters())
    names = [name for name, _ in policy.named_parameters()]
    record = {"names": names, "weights": gathered(policy), "local_numel": local}
    if trainer.ref_model is not None:
        record["reference_weights"] = gathered(trainer.accelerator.unwrap_model(trainer.ref_model))
    return record


def local_numel(param) -> int:
    if hasattr(param, "ds_tensor"):  # ZeRO-3
        return param.ds_tensor.numel()
    return param.to_local().numel() if hasattr(param, "to_local") else param.numel()  # FSDP2 DTensor


def gathered(model) -> list:
    with full_parameters(model) as params:
        return [p.detach().flatten().tolist() for p in params]


if __name__ == "__main__":
    main()
