"""How a fit is validated on shapes it never saw: the unseen Llama architectures and when they
are measured (`unseen`), whole Hugging Face models (`hf_models`) timed forward and backward
and predicted from the coefficients (`measure`), real FSDP2 steps and collectives at unseen
payloads (`fsdp_step`), and the accuracy report (`report`). Nothing here fits: the truth is
measured independently of the fit it checks."""
