"""The hello job of bench/launch/python_jobs.py: rendezvous (env://, torchrun's variables), a gloo
process group, one all_reduce checked against the expected sum, a barrier, exit."""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    n = dist.get_world_size()
    if t[0].item() != n * (n + 1) / 2:
        raise SystemExit(f"hello.py: rank {dist.get_rank()}: all_reduce gave {t[0].item()}, expected {n * (n + 1) / 2}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
