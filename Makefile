# qrl build.  `make` builds build/bin/* and build/lib/libqrl.a; see `make help`.
#
# Sources are found by folder, so adding a module needs no edit here:
#   common/*/*.c, kernels/cpu/*.c         -> build/lib/libqrl.a
#   kernels/cuda/*.cu                     -> build/lib/libqrl_cuda.a  (when nvcc is found)
#   kernels/base/*.c                      -> build/lib/libqrl_base.a  (status, checksums: what
#                                            the kernels need, so each library links once)
#   services/{learner,rollout,ctl}/*.c    -> build/bin/qrl-learner, qrl-rollout, qrlctl
#   services/tools/qrl-*.c                -> build/bin/qrl-*  (one file, one tool; a tool's
#                                            further sources in services/tools/qrl-*/)
#   tests/unit/test_*.c                   -> build/tests/unit/test_*   (Criterion)
#   tests/integration/*.c                 -> build/tests/integration/*  (plain programs the
#                                            integration scripts run)
#   tests/cuda/test_*.c                   -> build/tests/cuda/test_*   (make test-cuda)
#   tests/fuzz/fuzz_*.c                   -> replayed over tests/fuzz/corpus/<name>/ by make test;
#                                            libFuzzer builds with make fuzz
#   bench/*.c                             -> build/bench/*

BUILD   ?= build
CC      ?= gcc
SAN     ?= 0
QRL_CUDA ?= 1
OPT     ?= -O2
MAKEFLAGS += -j$(shell nproc)

# ---- CUDA toolchain: system toolkit, else the PyPI wheels deploy/setup.sh installed ----
DEPS    ?= $(or $(QRL_DEPS),$(CURDIR)/.deps)
NVCC    ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc) $(wildcard $(DEPS)/cuda/nvidia/cu13/bin/nvcc))
ifeq ($(QRL_CUDA),0)
NVCC :=
endif
ifneq ($(NVCC),)
CUDA_HOME ?= $(abspath $(dir $(NVCC))/..)
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64) $(CUDA_HOME)/lib)
NCCL_HOME ?= $(firstword $(wildcard $(DEPS)/cuda/nvidia/nccl) $(CUDA_HOME))
CUDA_CFLAGS := -DQRL_HAVE_CUDA=1 -I$(CUDA_HOME)/include -I$(NCCL_HOME)/include
CUDA_LDLIBS := -L$(CUDA_LIBDIR) -L$(NCCL_HOME)/lib -Wl,-rpath,$(CUDA_LIBDIR) -Wl,-rpath,$(NCCL_HOME)/lib \
               -lcudart -lcublasLt -lcublas -lnccl -lstdc++
NVCC_ARCH ?= -arch=sm_90
NVCCFLAGS ?= $(NVCC_ARCH) -O3 -std=c++17 -Xcompiler -fPIC -Xcompiler -Wall -Werror all-warnings \
             -Icommon -Ikernels -I$(NCCL_HOME)/include
endif

WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -g $(WARN) -fPIC -pthread -fopenmp \
           -Icommon -Ikernels -I$(BUILD)/gen $(CUDA_CFLAGS)
LDLIBS  += -lgrpc -lgpr -lprotobuf-c -luv -lrdkafka -ljansson -lyaml -lpcre2-8 -lutf8proc \
           -lmicrohttpd -lm -pthread -fopenmp $(CUDA_LDLIBS)
ifeq ($(SAN),1)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

# ---- sources ------------------------------------------------------------------------
PROTO_C   := $(BUILD)/gen/qrl.pb-c.c
PROTO_H   := $(BUILD)/gen/qrl.pb-c.h
LIB_SRCS  := $(wildcard common/*/*.c kernels/cpu/*.c)
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/qrl.pb-c.o
BASE_SRCS := $(wildcard kernels/base/*.c)
BASE_OBJS := $(BASE_SRCS:%.c=$(BUILD)/obj/%.o)
CU_SRCS   := $(if $(NVCC),$(wildcard kernels/cuda/*.cu))
CU_OBJS   := $(CU_SRCS:%.cu=$(BUILD)/obj/%.o)
LIBQRL    := $(BUILD)/lib/libqrl.a
LIBCUDA   := $(if $(CU_SRCS),$(BUILD)/lib/libqrl_cuda.a)
LIBBASE   := $(BUILD)/lib/libqrl_base.a

DAEMONS   := $(foreach d,learner rollout,$(if $(wildcard services/$(d)/*.c),$(BUILD)/bin/qrl-$(d))) \
             $(if $(wildcard services/ctl/*.c),$(BUILD)/bin/qrlctl)
TOOLS     := $(patsubst services/tools/%.c,$(BUILD)/bin/%,$(wildcard services/tools/qrl-*.c))
TOOL_LIB  := $(filter-out services/tools/qrl-%.c,$(wildcard services/tools/*.c))
BINS      := $(DAEMONS) $(TOOLS)
UNIT_TESTS:= $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.c))
INTEG_BINS:= $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/integration/*.c))
CUDA_TESTS:= $(if $(NVCC),$(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/cuda/test_*.c)))
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_REPLAY := $(patsubst tests/fuzz/%.c,$(BUILD)/tests/fuzz/%-replay,$(FUZZ_SRCS))
BENCHES   := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
TEST_HELPERS := $(wildcard tests/support/*.c)

.SECONDARY:
.PHONY: all test test-cuda test-long sanitize bench fuzz docs clean help proto-check demo print-nvcc print-nvflags
all: $(LIBQRL) $(LIBCUDA) $(LIBBASE) $(BINS)

help:
	@echo "make              build build/bin/* and build/lib/libqrl.a (CUDA backend when nvcc is found; QRL_CUDA=0 disables)"
	@echo "make test         the dependency rules (tests/layering.sh), then the CPU tests (unit, fuzz corpora, integration); ends 'N passed, N failed'"
	@echo "make test-cuda    GPU tests (needs a GPU)"
	@echo "make sanitize     the CPU tests under ASan+UBSan (build/san)"
	@echo "make fuzz         libFuzzer runs of tests/fuzz/fuzz_*.c, FUZZ_SECONDS each (default 60)"
	@echo "make bench        build the benchmarks in build/bench/"
	@echo "make docs         regenerate docs/config-<program>.md from the config tables"
	@echo "make demo         the main job: broker + learner + 2 rollout replicas on the built-in task (DEMO_ARGS=...)"

# ---- generated protobuf-c code (STYLE 11: generated by the build, never committed) --
# Grouped target (&:): one protoc-c run makes both files, also under -j.
# protoc-c 1.4 names a service-struct member after each rpc, and Learner.Register's
# `register` is a C keyword: rename that member (the wire path stays /qrl.Learner/Register).
$(PROTO_C) $(PROTO_H) &: proto/qrl.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -Iproto proto/qrl.proto
	sed -i -e 's/(\*register)(/(*register_)(/' -e 's/## register,/## register_,/' $(PROTO_H)

# Objects depend on the flags they were built with: a build that finds nvcc after one that
# did not (or QRL_CUDA / SAN / OPT change) recompiles everything instead of mixing objects
# with and without -DQRL_HAVE_CUDA.
FLAGS_STAMP := $(BUILD)/.flags-$(shell echo '$(CC) $(CFLAGS) $(NVCC) $(NVCCFLAGS)' | md5sum | cut -c1-12)
$(FLAGS_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/.flags-*
	@touch $@

$(BUILD)/obj/gen/qrl.pb-c.o: $(PROTO_C) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-unused-parameter -c $< -o $@

$(BUILD)/obj/%.o: %.c $(PROTO_H) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIBQRL): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/lib/libqrl_cuda.a: $(CU_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIBBASE): $(BASE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Each library once, users before what they use: libqrl (common/, kernels/cpu) calls the
# CUDA library, and both call only the kernels' base below them (docs/architecture.md).
LINK_LIBS = $(LIBQRL) $(LIBCUDA) $(LIBBASE)

define daemon_rule
$(BUILD)/bin/$(2): $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard services/$(1)/*.c)) $(LINK_LIBS)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(LDFLAGS) -o $$@ $$(filter %.o,$$^) $$(LINK_LIBS) $$(LDLIBS)
endef
$(eval $(call daemon_rule,learner,qrl-learner))
$(eval $(call daemon_rule,rollout,qrl-rollout))
$(eval $(call daemon_rule,ctl,qrlctl))

# A tool whose source outgrows one file keeps the rest in services/tools/qrl-NAME/*.c.
.SECONDEXPANSION:
$(BUILD)/bin/qrl-%: $(BUILD)/obj/services/tools/qrl-%.o \
    $$(addprefix $(BUILD)/obj/,$$(subst .c,.o,$$(wildcard services/tools/qrl-$$*/*.c))) \
    $(TOOL_LIB:%.c=$(BUILD)/obj/%.o) $(LINK_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LINK_LIBS) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_HELPERS) $(LINK_LIBS) $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -Wno-missing-field-initializers $(LDFLAGS) -o $@ $< $(TEST_HELPERS) $(LINK_LIBS) -lcriterion $(LDLIBS)

# Helpers of the integration scripts: plain programs with their own main.
$(BUILD)/tests/integration/%: tests/integration/%.c $(LINK_LIBS) $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LINK_LIBS) $(LDLIBS)

# Fuzz targets replayed over their corpus as ordinary tests (gcc, plus the sanitizers in make sanitize).
$(BUILD)/tests/fuzz/%-replay: tests/fuzz/%.c tests/fuzz/replay_main.c $(LINK_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< tests/fuzz/replay_main.c $(LINK_LIBS) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LINK_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LINK_LIBS) $(LDLIBS)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---- test tiers ----------------------------------------------------------------------
# tests/layering.sh: the dependency rules of docs/architecture.md; it runs first and fails
# the target, but the test tiers still run after it.
test: all $(UNIT_TESTS) $(FUZZ_REPLAY) $(INTEG_BINS) $(BUILD)/bench/e2e_engine # e2e_trace.sh's anchor
	@BUILD=$(BUILD) tests/layering.sh; l=$$?; \
	 BUILD=$(BUILD) tests/run.sh unit fuzz integration multihost; r=$$?; \
	 [ $$l -eq 0 ] && [ $$r -eq 0 ]

test-cuda: all $(CUDA_TESTS)
	@BUILD=$(BUILD) tests/run.sh cuda

test-long: all
	@BUILD=$(BUILD) tests/run.sh multihost long

sanitize:
	$(MAKE) BUILD=build/san SAN=1 OPT=-O1 QRL_CUDA=0 test

bench: all $(BENCHES)

# The main job (README): deploy/local/launch.sh with its defaults; DEMO_ARGS passes flags.
demo: all
	deploy/local/launch.sh $(DEMO_ARGS)

# libFuzzer builds: clang, whole library recompiled with the fuzzer instrumentation.
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icommon -Ikernels -I$(BUILD)/gen -fopenmp=libgomp
fuzz: $(PROTO_H)
	@mkdir -p $(BUILD)/fuzz
	@for f in $(FUZZ_SRCS); do n=$$(basename $$f .c); \
	  clang $(FUZZ_CFLAGS) -o $(BUILD)/fuzz/$$n $$f $(LIB_SRCS) $(BASE_SRCS) $(PROTO_C) $(filter-out -fopenmp,$(LDLIBS)) -lgomp || exit 1; \
	  mkdir -p $(BUILD)/fuzz/corpus-$$n; \
	  echo "fuzz: $$n for $(FUZZ_SECONDS)s"; \
	  $(BUILD)/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(BUILD)/fuzz/$$n- \
	    $(BUILD)/fuzz/corpus-$$n tests/fuzz/corpus/$$n || exit 1; \
	done

docs: $(BINS)
	@for b in $(DAEMONS) $(TOOLS); do $$b --help-markdown > docs/config-$$(basename $$b).md 2>/dev/null || rm -f docs/config-$$(basename $$b).md; done

clean:
	rm -rf $(BUILD)

# For scripts that run the CUDA compiler themselves (tests/integration/cuda_no_spills.sh).
print-nvcc:
	@echo $(NVCC)
print-nvflags:
	@echo $(NVCCFLAGS)
